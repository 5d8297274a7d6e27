"""The evaluation tests reuse the training tests' tiny-run overrides and config composition, and the data
tests' raster fixtures."""

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS / "train"), str(TESTS / "data")]
