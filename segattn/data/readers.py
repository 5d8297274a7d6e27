"""Decode image and mask files into numpy arrays, turning every failure into a DataError naming the file.

Image conversions (documented in the README): grayscale is replicated to 3 channels, alpha is dropped
(not composited), palette images are expanded through their palette, 16-bit images keep their top
8 bits. EXIF orientation is ignored so that images stay on the same pixel grid as their masks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from .errors import DataError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp")
_INT_MODES = ("I", "I;16", "I;16B", "I;16L", "I;16N")


def _open(path: Path, what: str) -> Image.Image:
    if not path.is_file():
        raise DataError(f"{what} {path} does not exist", path)
    try:
        image = Image.open(path)
        image.load()  # decode now: truncated or corrupt files fail here, not later in a worker
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        message = f"{what} {path} cannot be decoded ({err}); the file is corrupt or truncated"
        raise DataError(message, path) from None
    return image


def _as_uint16(image: Image.Image, path: Path, what: str) -> np.ndarray:
    values = np.asarray(image).astype(np.int64)
    if values.size and (values.min() < 0 or values.max() > 65535):
        raise DataError(f"{what} {path} (mode {image.mode}) has values outside 0..65535", path)
    return values.astype(np.uint16)


def read_image(path: str | Path) -> np.ndarray:
    """RGB uint8 [H, W, 3] from any 8- or 16-bit image file (see the module docstring for conversions)."""
    path = Path(path)
    image = _open(path, "image")
    if image.mode in _INT_MODES:
        gray = (_as_uint16(image, path, "image") >> 8).astype(np.uint8)
        return np.repeat(gray[..., None], 3, axis=2)
    if image.mode == "F":
        raise DataError(f"image {path} is a float image (mode F); save it as 8-bit RGB", path)
    return np.asarray(image.convert("RGB"))


def read_mask(path: str | Path) -> np.ndarray:
    """Raw label values [H, W] as stored (uint8, or uint16 for 16-bit PNGs); palette PNGs give indices.

    A 3-channel mask whose channels are equal is read as one channel; a truly coloured one is an error,
    since colours need a palette (the ``folder`` dataset's ``mask_format: color``).
    """
    path = Path(path)
    image = _open(path, "mask")
    mode = image.mode
    if mode in ("L", "P"):
        return np.asarray(image)
    if mode == "1":
        return np.asarray(image).astype(np.uint8)
    if mode in _INT_MODES:
        return _as_uint16(image, path, "mask")
    if mode in ("LA", "PA"):
        return np.asarray(image)[..., 0]
    if mode in ("RGB", "RGBA"):
        rgb = np.asarray(image)[..., :3]
        if (rgb[..., 0] == rgb[..., 1]).all() and (rgb[..., 0] == rgb[..., 2]).all():
            return np.ascontiguousarray(rgb[..., 0])
        raise DataError(
            f"mask {path} is a colour image (mode {mode}) but an index mask (one channel, value = class) "
            "was expected; for colour masks use data=folder with data.mask_format=color",
            path,
        )
    raise DataError(f"mask {path} has unsupported mode {mode}; expected an 8- or 16-bit index PNG", path)


def read_color_mask(path: str | Path) -> np.ndarray:
    """RGB uint8 [H, W, 3] of a colour-coded mask (alpha dropped)."""
    path = Path(path)
    return np.asarray(_open(path, "mask").convert("RGB"))
