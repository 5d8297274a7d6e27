"""The reliability tests reuse the data tests' fixtures (tiny datasets and planted bad-data cases) and the
training tests' tiny-run overrides."""

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS / "data"), str(TESTS / "train")]
