"""Small GeoTIFFs for the raster tests (a plain module: test files stay unique): scenes, label rasters
and a ``data=raster`` dataset tree."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import rasterio
from rasterio.crs import CRS
from rasterio.transform import Affine

CRS_UTM = CRS.from_epsg(32633)
TRANSFORM = Affine(0.5, 0.0, 500000.0, 0.0, -0.5, 4650000.0)  # 0.5 m pixels, north up
CLASSES = ["background", "field", "water"]


def write_geotiff(path: Path, bands: np.ndarray, crs: CRS | None = CRS_UTM, **profile) -> Path:
    """bands [C, H, W] as a tiled (256²), deflate-compressed GeoTIFF on the test grid."""
    count, height, width = bands.shape
    path.parent.mkdir(parents=True, exist_ok=True)
    with rasterio.open(
        path, "w", driver="GTiff", height=height, width=width, count=count, dtype=bands.dtype, crs=crs,
        transform=TRANSFORM, tiled=True, blockxsize=256, blockysize=256, compress="deflate", **profile,
    ) as dataset:  # fmt: skip
        dataset.write(bands)
    return path


def scene(size: tuple[int, int], seed: int = 0) -> np.ndarray:
    """uint8 [3, H, W]: smooth gradients with noise, so a tiny model's classes vary over the image."""
    rng = np.random.default_rng(seed)
    rows, cols = np.mgrid[0 : size[0], 0 : size[1]]
    smooth = np.stack([rows * 255 // size[0], cols * 255 // size[1], (rows + cols) % 256])
    return np.clip(smooth + rng.integers(-40, 40, (3, *size)), 0, 255).astype(np.uint8)


def label_raster(size: tuple[int, int], seed: int = 0) -> np.ndarray:
    """uint8 [1, H, W]: classes 0..2 in 16-pixel blocks, a 255 (ignore) band along the top."""
    rng = np.random.default_rng(seed + 100)
    blocks = rng.integers(0, len(CLASSES), (-(-size[0] // 16), -(-size[1] // 16)), dtype=np.uint8)
    labels = np.kron(blocks, np.ones((16, 16), dtype=np.uint8))[: size[0], : size[1]]
    labels[:5] = 255
    return labels[None]


def make_raster_dataset(root: Path, splits: dict[str, list[tuple[int, int]]]) -> Path:
    """images/<split>/sNN.tif + masks/<split>/sNN.tif (one pair per size) and a classes.json."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "classes.json").write_text(json.dumps(CLASSES))
    for split, sizes in splits.items():
        for index, size in enumerate(sizes):
            write_geotiff(root / "images" / split / f"s{index:02d}.tif", scene(size, index))
            write_geotiff(root / "masks" / split / f"s{index:02d}.tif", label_raster(size, index))
    return root


def read_band(path: Path) -> np.ndarray:
    """Band 1 of a raster, whole (test-sized files only)."""
    with rasterio.open(path) as dataset:
        return dataset.read(1)
