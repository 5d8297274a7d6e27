"""Rasters read and written by window with rasterio: tiled GeoTIFF / BigTIFF images larger than memory.

rasterio (GDAL underneath) reads any window of a tiled, compressed GeoTIFF or BigTIFF by decoding only
the tiles it touches, writes tiled compressed GeoTIFFs block by block, and carries the CRS and the
affine transform that remote-sensing users expect to find again on the mask. Every error names the
file and, for reads, the window (rows top:bottom, columns left:right).

Below data/ (training windows of GeoTIFF pairs, ``data.raster``) and inference/ (streaming predict,
``inference.raster_predict``), which both read rasters here; without torch, as predict with an ONNX model.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
from rasterio.enums import ColorInterp, Resampling
from rasterio.errors import NotGeoreferencedWarning, RasterioError
from rasterio.windows import Window as RioWindow

from .tiling import Window

BLOCK = 256  # output tile side; strips are whole tile rows, so every tile is written once
GDAL_CACHE_MB = 64  # GDAL's block cache (its default is 5 % of RAM, which would dominate peak memory)


def describe_window(window: Window) -> str:
    """``rows 0:1024, columns 512:1536`` for error messages."""
    top, bottom, left, right = window
    return f"rows {top}:{bottom}, columns {left}:{right}"


@contextmanager
def raster_env() -> Iterator[None]:
    """GDAL settings for windowed work: a bounded block cache, no warning for TIFFs without a CRS."""
    with rasterio.Env(GDAL_CACHEMAX=GDAL_CACHE_MB), warnings.catch_warnings():
        warnings.simplefilter("ignore", NotGeoreferencedWarning)
        yield


class RasterImage:
    """An 8-bit image raster open for windowed reads: gray (1 band), RGB (3) or RGB + alpha (4).

    Opening checks what every read relies on, so a wrong band count or sample type fails before any output
    exists. Use inside ``raster_env()``.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.dataset = rasterio.open(path)
        except RasterioError as error:
            raise ValueError(f"cannot open raster {path}: {error}") from None
        dataset = self.dataset
        interp = dataset.colorinterp
        if dataset.count == 1 or dataset.count == 3:
            self.bands = [1, 1, 1] if dataset.count == 1 else [1, 2, 3]
        elif dataset.count == 4 and interp[3] == ColorInterp.alpha:
            self.bands = [1, 2, 3]
        else:
            dataset.close()
            names = ", ".join(band.name for band in interp)
            raise ValueError(
                f"raster {path} has {dataset.count} bands ({names}); expected 1 (gray), 3 (RGB) or "
                "4 (RGB + alpha): write the three bands the model was trained on to a new file"
            )
        if dataset.dtypes[0] != "uint8":
            dataset.close()
            raise ValueError(
                f"raster {path} holds {dataset.dtypes[0]} samples; expected uint8 (0..255), as the model's "
                "normalisation assumes: rescale it to 8 bits first (e.g. gdal_translate -ot Byte -scale)"
            )
        self.size = (dataset.height, dataset.width)
        self.profile = {"crs": dataset.crs, "transform": dataset.transform}

    def read(self, window: Window) -> np.ndarray:
        """uint8 [h, w, 3] of ``window`` (top, bottom, left, right); gray is repeated into three channels."""
        top, bottom, left, right = window
        try:
            bands = self.dataset.read(self.bands, window=RioWindow(left, top, right - left, bottom - top))
        except RasterioError as error:
            raise ValueError(
                f"cannot read raster {self.path} at {describe_window(window)}: {error}"
            ) from None
        return np.ascontiguousarray(bands.transpose(1, 2, 0))

    def close(self) -> None:
        self.dataset.close()


def check_pair(image: Path, mask: Path) -> None:
    """Refuse (ValueError) an image raster and label raster that differ in size, CRS or transform."""
    with rasterio.open(image) as a, rasterio.open(mask) as b:
        if (a.height, a.width) != (b.height, b.width):
            raise ValueError(
                f"mask {mask} is {b.height}×{b.width} pixels; its image {image} is {a.height}×{a.width}"
            )
        if a.crs != b.crs:
            raise ValueError(f"mask {mask} has CRS {b.crs}; its image {image} has {a.crs}: reproject one")
        if not a.transform.almost_equals(b.transform):
            raise ValueError(
                f"mask {mask} has transform {tuple(b.transform)[:6]}; its image {image} has "
                f"{tuple(a.transform)[:6]}: the pixels do not line up"
            )


def has_size(path: Path, size: tuple[int, int]) -> bool:
    """Whether ``path`` opens as a raster of ``size`` (H, W): a partial mask a kill left readable."""
    try:
        with rasterio.open(path) as dataset:
            return (dataset.height, dataset.width) == size
    except RasterioError:
        return False


def mask_dtype(num_classes: int) -> str:
    """uint8 up to 256 classes, uint16 above (as the PNG masks)."""
    return "uint8" if num_classes <= 256 else "uint16"


def create_mask(path: Path, size: tuple[int, int], num_classes: int, geo: dict[str, Any]) -> None:
    """An empty single-band, tiled, deflate-compressed GeoTIFF (BigTIFF when needed) on ``geo``'s grid."""
    profile = {
        "driver": "GTiff",
        "height": size[0],
        "width": size[1],
        "count": 1,
        "dtype": mask_dtype(num_classes),
        "tiled": True,
        "blockxsize": BLOCK,
        "blockysize": BLOCK,
        "compress": "deflate",
        "BIGTIFF": "IF_SAFER",
        **geo,
    }
    path.unlink(missing_ok=True)  # GDAL would open (and choke on) a half-written file before replacing it
    with rasterio.open(path, "w", **profile):
        pass


def write_rows(path: Path, top: int, mask: np.ndarray, palette: list[tuple[int, int, int]]) -> None:
    """Write ``mask`` [rows, W] at row ``top`` and close, so the rows are on disk when this returns. 8-bit
    masks get the palette as colour table, so GIS viewers show class colours."""
    with rasterio.open(path, "r+") as dataset:
        dataset.write(
            mask.astype(dataset.dtypes[0]), 1, window=RioWindow(0, top, mask.shape[1], mask.shape[0])
        )
        if top == 0 and dataset.dtypes[0] == "uint8":
            dataset.write_colormap(1, {index: (*colour, 255) for index, colour in enumerate(palette)})


def read_overview(path: Path, longest: int) -> np.ndarray:
    """The mask resampled (nearest class) so that its longest side is at most ``longest`` pixels."""
    with rasterio.open(path) as dataset:
        scale = min(1.0, longest / max(dataset.height, dataset.width))
        shape = (max(1, round(dataset.height * scale)), max(1, round(dataset.width * scale)))
        return dataset.read(1, out_shape=shape, resampling=Resampling.nearest)


__all__ = [
    "BLOCK",
    "RasterImage",
    "check_pair",
    "create_mask",
    "describe_window",
    "has_size",
    "mask_dtype",
    "raster_env",
    "read_overview",
    "write_rows",
]
