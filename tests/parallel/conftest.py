"""The band-parallel tests reuse the training tests' tiny-run overrides and config composition."""

import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "train")]
