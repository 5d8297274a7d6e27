"""python -m segattn.bench raster at a tiny size: the generated GeoTIFF is streamed through predict in a
child process and the row reports its windows, peak memory and a complete, georeferenced mask."""

from __future__ import annotations

import json

import numpy as np
import rasterio

from segattn.bench.__main__ import main
from segattn.bench.raster import LIMIT_BYTES


def test_raster_bench_streams_a_generated_geotiff_and_reports_peak_memory(tmp_path):
    assert main(["raster", "grid=smoke", "size=300", "crop=128", "threads=1", f"out={tmp_path}"]) == 0
    row = json.loads((tmp_path / "raster.json").read_text())
    assert row["status"] == 0 and row["windows"] == 16  # 4 × 4 windows of 128 every 64 over 300 pixels
    assert 0 < row["peak_bytes"] < LIMIT_BYTES and row["within_limit"]
    with rasterio.open(tmp_path / "raster" / "scene_300.tif") as image:
        crs, transform = image.crs, image.transform
        assert image.profile["tiled"] and image.profile["compress"] == "deflate" and image.count == 3
    with rasterio.open(tmp_path / "raster" / "prediction" / "masks" / "scene_300.tif") as mask:
        assert (mask.crs, mask.transform, mask.shape) == (crs, transform, (300, 300))
        assert np.isin(np.unique(mask.read(1)), [0, 1, 2]).all()
    assert (tmp_path / "raster.csv").is_file()
