"""The reliability tests reuse the data tests' fixtures (tiny datasets and planted bad-data cases)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
