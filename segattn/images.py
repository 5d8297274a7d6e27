"""Image files and what their pixels mean, without torch: decoding, classes.json, palettes, normalisation.

Training (``segattn.data``) and prediction (``segattn.predict``, ``segattn.inference``) both read images
here, so a file gives the model the same pixels in both. Image conversions: grayscale is replicated to
3 channels, alpha is dropped (not composited), palette images are expanded through their palette, 16-bit
images keep their top 8 bits. EXIF orientation is ignored so that images stay on the same pixel grid as
their masks. Every failure is a ``DataError`` naming the file.

Nothing here imports torch, Lightning or Hydra: an ONNX model's ``predict`` runs on numpy and Pillow alone.
"""

from __future__ import annotations

import errno
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral
from pathlib import Path

import numpy as np
from PIL import Image

from .errors import SegattnError
from .files import atomic_write_text

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp")
RASTER_SUFFIXES = (".tif", ".tiff")  # GeoTIFF / BigTIFF: what can be read by window
CLASSES_FILE = "classes.json"
# ImageNet statistics of RGB / 255: every dataset's default normalisation (the conf/data files repeat
# them, and a test checks that they agree) and that of models whose metadata records none.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IGNORE_INDEX = 255  # the mask value (train id) that no loss or metric counts
_INT_MODES = ("I", "I;16", "I;16B", "I;16L", "I;16N")

Color = tuple[int, int, int]


class DataError(SegattnError, ValueError):
    """A data file or folder is unusable; the message names it and says what was expected."""

    def __init__(self, message: str, path: str | Path | None = None):
        super().__init__(message)
        self.path = None if path is None else str(path)


class ImageTooLargeError(DataError):
    """An image with more pixels than Pillow decodes at once (``Image.MAX_IMAGE_PIXELS``)."""


def as_hw(size: object, key: str = "size") -> tuple[int, int]:
    """(height, width) from a size as configs write it: H (a square), [H] or [H, W], in pixels. Every
    reader of a size (crops, windows, strides, image sizes) parses it here; anything else is a ValueError
    naming ``key`` and the value."""
    sides = list(size) if isinstance(size, Sequence) and not isinstance(size, str) else [size]
    if len(sides) not in (1, 2) or not all(
        isinstance(side, Integral) and not isinstance(side, bool) and side > 0 for side in sides
    ):
        raise ValueError(f"{key}={size!r}: expected a positive size: H or [H, W] in pixels")
    return int(sides[0]), int(sides[-1])


def is_raster(path: Path) -> bool:
    """A TIFF file name: the inputs that can be read by window (GeoTIFF, BigTIFF)."""
    return path.suffix.lower() in RASTER_SUFFIXES


def not_a_file(path: Path) -> str:
    """Why ``path`` cannot be read as a file: it does not exist, or what it is instead (a folder, a
    symbolic link that loops or points nowhere, a FIFO, socket or device)."""
    if path.is_symlink() and not path.exists():
        try:
            path.resolve(strict=True)
        except RuntimeError:  # Python 3.11: a loop; later versions raise OSError(ELOOP)
            return "is a symbolic link loop"
        except OSError as error:
            return "is a symbolic link loop" if error.errno == errno.ELOOP else "is a broken symbolic link"
        return "is a broken symbolic link"
    if path.is_dir():
        return "is a folder, not a file"
    if path.exists():
        return "is not a regular file (a FIFO, socket or device)"
    return "does not exist"


def _open(path: Path, what: str) -> Image.Image:
    if not path.is_file():
        raise DataError(f"{what} {path} {not_a_file(path)}", path)
    try:
        image = Image.open(path)
        image.load()  # decode now: truncated or corrupt files fail here, not later in a worker
    except Image.DecompressionBombError as err:
        pixels = re.search(r"\((\d+) pixels\)", str(err))
        size = f"{int(pixels.group(1)):,} pixels" if pixels else "too many pixels"
        limit = f"Pillow's limit {Image.MAX_IMAGE_PIXELS:,}"
        raise ImageTooLargeError(
            f"{what} {path} has {size}, more than is read whole ({limit})", path
        ) from None
    except (OSError, SyntaxError, ValueError) as err:
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
    with _open(path, "image") as image:
        if image.mode in _INT_MODES:
            gray = (_as_uint16(image, path, "image") >> 8).astype(np.uint8)
            return np.repeat(gray[..., None], 3, axis=2)
        if image.mode == "F":
            raise DataError(f"image {path} is a float image (mode F); save it as 8-bit RGB", path)
        return np.asarray(image.convert("RGB"))


def read_image_size(path: str | Path) -> tuple[int, int]:
    """(height, width) of an image file from its header, without decoding the pixels; a file Pillow cannot
    open is read whole, so that its DataError names the problem."""
    try:
        with Image.open(path) as image:
            width, height = image.size
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        height, width = read_image(path).shape[:2]
    return int(height), int(width)


def read_mask(path: str | Path) -> np.ndarray:
    """Raw label values [H, W] as stored (uint8, or uint16 for 16-bit PNGs); palette PNGs give indices.

    A 3-channel mask whose channels are equal is read as one channel; a truly coloured one is an error,
    since colours need a palette (the ``folder`` dataset's ``mask_format: color``).
    """
    path = Path(path)
    with _open(path, "mask") as image:
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
    with _open(path, "mask") as image:
        return np.asarray(image.convert("RGB"))


def default_palette(num_classes: int) -> list[Color]:
    """The PASCAL VOC colour map: bits of the class index spread over the high bits of R, G and B (0 is
    black); the palette of datasets and models that name no colours."""
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


@dataclass(frozen=True)
class ClassList:
    """What a classes.json says: class names by train id, their colours (None when it names none) and the
    colour of ignored pixels in colour masks (None when it names none)."""

    names: list[str]
    palette: list[Color] | None = None
    ignore_color: Color | None = None


CLASSES_SCHEMA = (
    'a list of names, {"classes": [{"id": 0, "name": "...", "color": [r, g, b]}, ...], "ignore": '
    '{"color": [r, g, b]}} (colours and ignore optional) or {"classes": [names], "palette": [[r, g, b], '
    "...]}"
)


def _color(value: object) -> Color:
    if not isinstance(value, (list, tuple)) or len(value) != 3 or not all(isinstance(v, int) for v in value):
        raise ValueError(f"colour {value!r} is not [r, g, b]")
    return int(value[0]), int(value[1]), int(value[2])


def read_classes(path: Path) -> ClassList:
    """Parse a classes.json (a dataset's or an exported model's); DataError naming the file otherwise.

    The forms of ``CLASSES_SCHEMA``: the names alone; one entry per class with id (0..K-1), name and optional
    colour, plus an optional ignore colour (``write_classes``'s form); or names with a parallel palette list
    (older exports).
    """
    try:
        spec = json.loads(path.read_text())
        entries = spec["classes"] if isinstance(spec, dict) else spec
        if not isinstance(entries, list):
            raise ValueError("'classes' is not a list")
        if all(isinstance(entry, str) for entry in entries):
            palette = spec.get("palette") if isinstance(spec, dict) else None
            if palette is not None and len(palette) != len(entries):
                raise ValueError(f"{len(entries)} classes but {len(palette)} palette colours")
            return ClassList(list(entries), None if palette is None else [_color(c) for c in palette])
        entries = sorted(entries, key=lambda entry: entry["id"])
        if [entry["id"] for entry in entries] != list(range(len(entries))):
            raise ValueError(f"class ids must be 0..{len(entries) - 1}")
        names = [str(entry["name"]) for entry in entries]
        colors = [_color(e["color"]) for e in entries] if all("color" in e for e in entries) else None
        ignore = spec.get("ignore", {}).get("color") if isinstance(spec, dict) else None
        return ClassList(names, colors, None if ignore is None else _color(ignore))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise DataError(
            f"{path} is not a valid classes.json ({err}); expected {CLASSES_SCHEMA}", path
        ) from None


def write_classes(directory: Path, names: list[str], palette: list[Color]) -> None:
    """``directory/classes.json``: one ``{"id", "name", "color"}`` entry per class index, the form a
    dataset root holds, so an exported model's file can describe a dataset too."""
    classes = [
        {"id": index, "name": str(name), "color": [int(v) for v in colour]}
        for index, (name, colour) in enumerate(zip(names, palette, strict=True))
    ]
    atomic_write_text(directory / CLASSES_FILE, json.dumps({"classes": classes}, indent=2) + "\n")


DOWNSAMPLE = "an integer >= 1 (1: full resolution)"  # what data.downsample must be


def is_downsample(value: object) -> bool:
    """Whether ``value`` is a valid ``data.downsample`` (``DOWNSAMPLE``); the schema and the folder dataset
    both ask here."""
    return isinstance(value, Integral) and not isinstance(value, bool) and value >= 1


def indivisible(height: int, width: int, factor: int) -> str | None:
    """Why an image of ``height`` × ``width`` cannot be shrunk by ``factor`` (``data.downsample``), or None:
    a side ``factor`` does not divide. Training refuses such an image as predict does, since a model
    trained on it would be refused every image of its own dataset."""
    if height % factor or width % factor:
        return f"is {width}x{height}, not a multiple of {factor} on each side"
    return None


def shrunk_size(height: int, width: int, factor: int) -> tuple[int, int]:
    """The size of a ``height`` × ``width`` image shrunk by ``factor``: each side rounded, at least 1."""
    return max(1, round(height / factor)), max(1, round(width / factor))


def shrink_image(image: np.ndarray, factor: int) -> np.ndarray:
    """``image`` [H, W, 3] shrunk by ``factor`` (area averaging) to (round(H/f), round(W/f)): how training
    (``data.downsample``) and prediction shrink an image, so a model sees the same pixels in both."""
    if factor == 1:
        return image
    import cv2  # opencv comes with albumentations; only a shrinking model needs it at predict time

    height, width = shrunk_size(*image.shape[:2], factor)
    return cv2.resize(np.ascontiguousarray(image), (width, height), interpolation=cv2.INTER_AREA)


__all__ = [
    "CLASSES_FILE",
    "DOWNSAMPLE",
    "IGNORE_INDEX",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "IMAGE_SUFFIXES",
    "RASTER_SUFFIXES",
    "ClassList",
    "Color",
    "DataError",
    "ImageTooLargeError",
    "as_hw",
    "default_palette",
    "indivisible",
    "is_downsample",
    "is_raster",
    "read_classes",
    "read_color_mask",
    "read_image",
    "read_mask",
    "shrink_image",
    "shrunk_size",
    "write_classes",
]
