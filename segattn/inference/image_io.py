"""Files around a model, without torch: images in, masks and overlays out, palettes, sidecar metadata.

The ONNX predict path runs on numpy, Pillow and onnxruntime only, so nothing here imports torch.
"""

from __future__ import annotations

import glob
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp")
RASTER_SUFFIXES = (".tif", ".tiff")  # GeoTIFF / BigTIFF: what segattn.predict can read by window
CLASSES_FILE = "classes.json"


def default_palette(num_classes: int) -> list[tuple[int, int, int]]:
    """Distinct colours for class indices: the bit-interleaved palette of PASCAL VOC (0 is black)."""
    palette = []
    for index in range(num_classes):
        red = green = blue = 0
        code = index
        for shift in range(7, -1, -1):
            red |= (code & 1) << shift
            green |= ((code >> 1) & 1) << shift
            blue |= ((code >> 2) & 1) << shift
            code >>= 3
        palette.append((red, green, blue))
    return palette


def find_images(pattern: str) -> list[Path]:
    """An image file, every image in a directory (sorted, not recursive), or the files a glob matches."""
    path = Path(pattern)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    elif path.is_file():
        files = [path]
    else:
        files = sorted(Path(p) for p in glob.glob(pattern, recursive=True) if Path(p).is_file())
    if not files:
        suffixes = ", ".join(IMAGE_SUFFIXES)
        raise FileNotFoundError(f"input={pattern!r} matches no image file (looked for {suffixes})")
    return files


def is_raster(path: Path) -> bool:
    """A TIFF file name: the inputs ``segattn.predict`` streams by window in slide mode."""
    return path.suffix.lower() in RASTER_SUFFIXES


def read_rgb(path: Path) -> np.ndarray:
    """The image as uint8 [H, W, 3]; grayscale, palette and RGBA images are converted to RGB.

    Raises ValueError naming the file when Pillow cannot decode it (corrupt, truncated, not an image).
    """
    try:
        with Image.open(path) as image:
            return np.asarray(image.convert("RGB"))
    except Image.DecompressionBombError as error:
        raise ValueError(too_large(path, error)) from None
    except (OSError, ValueError) as error:
        raise ValueError(f"cannot read image {path}: {error}") from None


def too_large(path: Path, error: Exception) -> str:
    """Why an image too large to hold whole (Pillow refuses it) is skipped, and the setting that reads it
    by window instead (a TIFF) or what to convert it to (any other format)."""
    pixels = re.search(r"\((\d+) pixels\)", str(error))
    size = f"{int(pixels.group(1)):,} pixels" if pixels else "too many pixels"
    how = (
        "mode=slide crop=1024 streams a TIFF by window (stream=true, the default)"
        if is_raster(path)
        else "convert it to a tiled GeoTIFF (e.g. gdal_translate -co TILED=YES) and use mode=slide "
        "crop=1024, which streams TIFFs by window"
    )
    limit = f"Pillow's limit {Image.MAX_IMAGE_PIXELS:,}"
    return f"image {path} has {size}, more than is read whole ({limit}); {how}"


def normalize(rgb: np.ndarray, mean: list[float], std: list[float]) -> np.ndarray:
    """uint8 [H, W, 3] -> float32 [1, 3, H, W]: (pixel / 255 - mean) / std, mean and std in [0, 1] units."""
    x = rgb.astype(np.float32) / 255.0
    x = (x - np.asarray(mean, dtype=np.float32)) / np.asarray(std, dtype=np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


def save_mask(mask: np.ndarray, path: Path) -> None:
    """An index mask [H, W] as a PNG: 8-bit grayscale for up to 256 classes, 16-bit otherwise."""
    path.parent.mkdir(parents=True, exist_ok=True)
    dtype = np.uint8 if mask.max(initial=0) < 256 else np.uint16
    Image.fromarray(mask.astype(dtype)).save(path)


def save_rgb(rgb: np.ndarray, path: Path) -> None:
    """A uint8 [H, W, 3] image as PNG (or whatever ``path``'s suffix names)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rgb).save(path)


def overlay(
    rgb: np.ndarray, mask: np.ndarray, palette: list[tuple[int, int, int]], alpha: float = 0.5
) -> np.ndarray:
    """The image blended with the palette colour of each pixel's class; uint8 [H, W, 3]."""
    colours = np.asarray(palette, dtype=np.float32)[mask]
    return (rgb.astype(np.float32) * (1 - alpha) + colours * alpha).round().astype(np.uint8)


def write_classes(directory: Path, classes: list[str], palette: list[tuple[int, int, int]]) -> None:
    """``classes.json``: class names and their RGB palette, one entry per class index."""
    payload = {"classes": list(classes), "palette": [list(map(int, colour)) for colour in palette]}
    (directory / CLASSES_FILE).write_text(json.dumps(payload, indent=2) + "\n")


def read_classes(directory: Path) -> dict[str, Any]:
    """Read and check ``classes.json``; names the file and the problem when it is malformed."""
    path = directory / CLASSES_FILE
    payload = json.loads(path.read_text())
    classes, palette = payload.get("classes"), payload.get("palette")
    if not isinstance(classes, list) or not isinstance(palette, list) or len(classes) != len(palette):
        raise ValueError(
            f"{path}: expected {{'classes': [names], 'palette': [[r, g, b], ...]}}, equal lengths"
        )
    return {"classes": [str(name) for name in classes], "palette": [tuple(map(int, c)) for c in palette]}


__all__ = [
    "CLASSES_FILE",
    "IMAGE_SUFFIXES",
    "RASTER_SUFFIXES",
    "default_palette",
    "find_images",
    "is_raster",
    "normalize",
    "overlay",
    "read_classes",
    "read_rgb",
    "save_mask",
    "save_rgb",
    "write_classes",
]
