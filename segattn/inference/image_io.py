"""Files around prediction, without torch: the images an input names, normalisation, masks and overlays.

Images are decoded by ``segattn.images.read_image``, as training decodes them. The ONNX predict path runs
on numpy, Pillow and onnxruntime only, so nothing here imports torch.
"""

from __future__ import annotations

import glob
from pathlib import Path

import numpy as np
from PIL import Image

from ..files import atomic_write
from ..images import IMAGE_SUFFIXES, Color, DataError, ImageTooLargeError, is_raster, read_image


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


def read_input(path: Path) -> np.ndarray:
    """``read_image`` (RGB uint8 [H, W, 3], decoded as training decodes it); an image too large to read
    whole names the setting that reads a TIFF by window, or what to convert any other format to; a TIFF the
    decoder cannot read says what it holds (``raster_problem``) instead of calling it corrupt."""
    try:
        return read_image(path)
    except ImageTooLargeError as error:
        how = (
            "inference.mode=slide inference.crop=1024 streams a TIFF by window (stream=true, the default)"
            if is_raster(path)
            else "convert it to a tiled GeoTIFF (e.g. gdal_translate -co TILED=YES) and use "
            "inference.mode=slide inference.crop=1024, which streams TIFFs by window"
        )
        raise ImageTooLargeError(f"{error}; {how}", path) from None
    except DataError:
        problem = raster_problem(path) if is_raster(path) else None
        if problem is None:
            raise
        raise DataError(problem, path) from None


def raster_problem(path: Path) -> str | None:
    """Why a TIFF that the image decoder could not read is no input, as the raster reader words it (a
    uint16 or float GeoTIFF: rescale it to 8 bits; bands other than gray, RGB or RGB + alpha), or, where it
    opens as a raster, the setting that reads it by window; None when it is no raster either."""
    from ..raster_io import RasterImage, raster_env

    try:
        with raster_env():
            RasterImage(path).close()
    except ValueError as error:
        return None if str(error).startswith("cannot open raster") else str(error)
    return (
        f"image {path} is a GeoTIFF the image decoder cannot read whole; stream=true with "
        "inference.mode=slide inference.crop=1024 reads it by window"
    )


def normalize(rgb: np.ndarray, mean: list[float], std: list[float]) -> np.ndarray:
    """uint8 [H, W, 3] -> float32 [1, 3, H, W]: (pixel / 255 - mean) / std, mean and std in [0, 1] units."""
    centre, scale = np.asarray([mean, std], dtype=np.float32)
    return np.ascontiguousarray(((rgb.astype(np.float32) / 255.0 - centre) / scale).transpose(2, 0, 1)[None])


def save_mask(mask: np.ndarray, path: Path) -> None:
    """An index mask [H, W] as a PNG: 8-bit grayscale for up to 256 classes, 16-bit otherwise."""
    dtype = np.uint8 if mask.max(initial=0) < 256 else np.uint16
    save_image(Image.fromarray(mask.astype(dtype)), path)


def save_rgb(rgb: np.ndarray, path: Path) -> None:
    """A uint8 [H, W, 3] image as PNG (or whatever ``path``'s suffix names)."""
    save_image(Image.fromarray(rgb), path)


def save_image(image: Image.Image, path: Path) -> None:
    """``image`` in the format ``path``'s suffix names, crash-safe (``files.atomic_write``)."""
    image_format = Image.registered_extensions()[path.suffix.lower()]
    atomic_write(path, lambda handle: image.save(handle, format=image_format))


def overlay(
    rgb: np.ndarray,
    mask: np.ndarray,
    palette: list[Color],
    alpha: float = 0.5,
    drawn: list[int] | None = None,
) -> np.ndarray:
    """The image blended with the palette colour of each pixel's class; uint8 [H, W, 3]. Only the classes
    ``drawn`` (palette indices; default: all) are coloured: any other pixel, an ignored one included, keeps
    the image's own. A table holds each class's round(pixel * (1 - alpha) + colour * alpha) in float32."""
    drawn = list(range(len(palette))) if drawn is None else drawn
    levels = np.arange(256, dtype=np.float32)
    blended = (levels * (1 - alpha) + np.asarray(palette, dtype=np.float32)[..., None] * alpha).round()
    table = np.concatenate([np.broadcast_to(levels, (1, 3, 256)), blended]).astype(np.uint8)  # 0: undrawn
    rows = np.zeros(max(int(mask.max(initial=0)), len(palette)) + 2, np.intp)  # rows[-1]: negative values
    rows[drawn] = (np.asarray(drawn) + 1) * table[0].size
    index = np.add(rows[mask.clip(-1) if mask.min(initial=0) < 0 else mask][..., None], rgb, dtype=np.intp)
    index += np.arange(0, table[0].size, 256)
    return np.take(table.ravel(), index)  # releases the GIL: predict's writer threads run in parallel


def drawn_classes(classes: list[str], chosen: str | int | list[str | int] | None) -> list[int]:
    """The indices of the classes an overlay colours: ``chosen`` (names or indices), or by default every
    class but one named "background"; ValueError naming a class the model does not have."""
    if chosen is None:
        return [index for index, name in enumerate(classes) if name.lower() != "background"]
    indices = []
    for entry in [chosen] if isinstance(chosen, str | int) else chosen:
        index = entry if isinstance(entry, int) else classes.index(entry) if entry in classes else None
        if index is None or not 0 <= index < len(classes):
            raise ValueError(
                f"overlay_classes: {entry!r} is not a class of this model; expected names of "
                f"{', '.join(classes)} or indices 0..{len(classes) - 1}"
            )
        indices.append(index)
    return indices


__all__ = [
    "drawn_classes",
    "find_images",
    "normalize",
    "overlay",
    "read_input",
    "save_mask",
    "save_rgb",
]
