"""The predict tests reuse the data tests' raster fixtures (small GeoTIFFs)."""

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS / "data")]
