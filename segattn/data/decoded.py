"""Large images decoded once: uncompressed arrays on disk, read back by memory map.

A 4288×2848 JPEG takes longer to decode than a training crop of it takes to read; decoding every image
again for every crop makes the data path, not the model, the cost of a step. ``DecodedCache`` decodes an
image and its mask once (optionally shrunk by an integer ``factor``), stores them as ``.npy`` files and
hands out memory-mapped arrays, so a crop reads only its window. Beside them it keeps, per class, a sample
of the pixel positions of that class: what foreground-centred crops draw from.

Shrinking: images by area averaging (cv2.INTER_AREA); masks by the label that covers most of each output
pixel (area-averaged one-hot planes, then argmax), so a lesion smaller than one output pixel disappears
from the labels exactly when it covers less than its competitors there.

The cache is keyed by the source file's absolute path, size and modification time, and by ``factor``: a
changed source is decoded again. Files are written to a temporary name and renamed, so an interrupted
write or two processes filling the same cache never leave a partial file.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np

from ..files import atomic_write
from ..images import read_image, shrink_image, shrunk_size
from .base import Sample

FOREGROUND_SAMPLE = 16384  # positions kept per class and image: plenty to draw crop centres from


def shrink_mask(mask: np.ndarray, factor: int) -> np.ndarray:
    """``mask`` [H, W] of label values shrunk by ``factor``: each output pixel takes the value that covers
    most of its area (ties go to the smaller value)."""
    if factor == 1:
        return mask
    height, width = shrunk_size(*mask.shape, factor)
    size = (width, height)
    values = np.unique(mask)
    cover = np.stack(
        [cv2.resize((mask == v).astype(np.float32), size, interpolation=cv2.INTER_AREA) for v in values]
    )
    return values[cover.argmax(axis=0)].astype(mask.dtype)


def foreground_positions(mask: np.ndarray, seed: int = 0) -> dict[int, np.ndarray]:
    """Per label value in ``mask``, flat positions of its pixels (a random sample of at most
    ``FOREGROUND_SAMPLE``, int64, sorted)."""
    rng = np.random.default_rng(seed)
    flat = mask.ravel()
    order = np.argsort(flat, kind="stable")
    values, starts = np.unique(flat[order], return_index=True)
    ends = [*starts[1:], flat.size]
    positions = {}
    for value, start, end in zip(values.tolist(), starts, ends, strict=True):
        where = order[start:end]
        if where.size > FOREGROUND_SAMPLE:
            where = rng.choice(where, FOREGROUND_SAMPLE, replace=False)
        positions[int(value)] = np.sort(where).astype(np.int64)
    return positions


class DecodedCache:
    """Decoded (and shrunk) images, masks and per-class positions of samples, cached under ``root``.

    ``root=None`` keeps nothing: every call decodes again (the same arrays, without the speed).
    """

    def __init__(self, root: str | Path | None) -> None:
        self.root = None if root is None else Path(root).expanduser()
        self.told = False  # whether this process has said where the cache grows

    def tell(self, path: Path, nbytes: int) -> None:
        """Say once per process where decoded arrays are being written and how large one is: a
        full-resolution IDRiD split fills gigabytes, which a user should not discover on a full disk."""
        if self.told:
            return
        self.told = True
        print(
            f"segattn: decoding images once into {self.root} (data.cache_dir; {path.name} of "
            f"{path.parent.name}: {nbytes / 2**20:.0f} MiB); later reads map them from there, and deleting "
            "the folder only costs decoding them again",
            file=sys.stderr,
        )

    def folder(self, path: Path, factor: int) -> Path | None:
        """Where the arrays of source ``path`` shrunk by ``factor`` live (None without a cache)."""
        if self.root is None or not path.is_file():  # a missing source fails in its decoder, by name
            return None
        path = path.resolve()
        stat = path.stat()
        key = hashlib.sha1(f"{path}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
        return self.root / f"x{factor}" / f"{path.stem}-{key}"

    def image(self, sample: Sample, factor: int = 1) -> np.ndarray:
        """RGB uint8 [H/f, W/f, 3] of the sample's image (memory-mapped when cached)."""
        return self._array(
            sample.image, factor, "image.npy", lambda: shrink_image(read_image(sample.image), factor)
        )

    def mask(self, sample: Sample, factor: int = 1) -> np.ndarray:
        """Train ids uint8 [H/f, W/f] of the sample's mask (memory-mapped when cached)."""
        return self._array(
            sample.mask, factor, "mask.npy", lambda: shrink_mask(sample.decoder.read(sample.mask), factor)
        )

    def positions(self, sample: Sample, factor: int = 1) -> dict[int, np.ndarray]:
        """Per train id, flat positions in ``mask(sample, factor)`` (``foreground_positions``)."""
        folder = self.folder(sample.mask, factor)
        if folder is None:
            return foreground_positions(self.mask(sample, factor))
        path = folder / "positions.npz"
        if not path.is_file():
            found = foreground_positions(self.mask(sample, factor))
            atomic_write(
                path,
                lambda handle: np.savez(handle, **{str(k): v for k, v in found.items()}),
                sole_writer=False,
            )
        with np.load(path) as stored:
            return {int(k): stored[k] for k in stored.files}

    def _array(self, source: Path, factor: int, name: str, decode: Callable[[], np.ndarray]) -> np.ndarray:
        folder = self.folder(source, factor)
        if folder is None:
            return decode()
        path = folder / name
        if not path.is_file():
            array = decode()
            self.tell(path, array.nbytes)
            atomic_write(path, lambda handle: np.save(handle, np.ascontiguousarray(array)), sole_writer=False)
        return np.load(path, mmap_mode="r")
