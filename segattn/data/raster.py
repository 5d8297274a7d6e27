"""``raster``: image/label raster pairs (GeoTIFF / BigTIFF) of any size, read by window, never whole.

Layout and classes are the ``folder`` dataset's (images/<split>/<stem>.tif + masks/<split>/<stem>.tif,
classes.json or data.classes, ``mask_values``), and so are the label checks and the augmentation
pipeline: each item is one window of an image and its mask, handed to the same transform.

- Splits in ``sample_splits`` (default: train) hold ``windows_per_split`` windows of ``window_size``
  drawn at random, rasters picked in proportion to their area, from a generator seeded with ``seed`` and
  the split name: every epoch, worker and resumed run sees the same windows (the transform's crops and
  flips still vary). The doctor's label histogram of such a split is a sample of the rasters.
- Other splits are cut into a grid of ``window_size`` tiles (smaller at the right and bottom border), so
  every pixel counts once: validation during training scores tiles; eval.py streams whole rasters.

Unlike torchgeo, which indexes rasters by geographic bounds and resamples to a common CRS, a pair here already
shares one pixel grid: windows are pixel offsets, and the pair check (size, CRS, transform) is all the
geography needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import rasterio
from rasterio.errors import RasterioError
from rasterio.windows import Window as RioWindow

from ..files import conf_values
from ..images import Color, DataError, is_raster
from ..raster_io import RasterImage, check_pair, describe_window, raster_env
from ..tiling import Window
from .base import Sample, SegDatasetBase, Transform
from .folder import FolderLayout
from .labels import LabelMap
from .transforms import build_eval_transform


def raster_size(path: Path) -> tuple[int, int]:
    """(height, width) of a raster, without reading pixels."""
    try:
        with raster_env(), rasterio.open(path) as dataset:
            return dataset.height, dataset.width
    except RasterioError as error:
        raise DataError(f"cannot open raster {path}: {error}", path) from None


def read_labels(path: Path, window: Window) -> np.ndarray:
    """Band 1 of the label raster ``path`` in ``window``: raw values [h, w]."""
    top, bottom, left, right = window
    try:
        with raster_env(), rasterio.open(path) as dataset:
            return dataset.read(1, window=RioWindow(left, top, right - left, bottom - top))
    except RasterioError as error:
        raise DataError(f"cannot read mask {path} at {describe_window(window)}: {error}", path) from None


def grid_windows(height: int, width: int, size: tuple[int, int]) -> list[Window]:
    """Non-overlapping tiles of ``size`` covering the raster, row-major, cut smaller at the border: every
    pixel is in exactly one tile."""
    return [
        (top, min(top + size[0], height), left, min(left + size[1], width))
        for top in range(0, height, size[0])
        for left in range(0, width, size[1])
    ]


def random_windows(
    sizes: Sequence[tuple[int, int]], size: tuple[int, int], count: int, seed: Sequence[int]
) -> list[tuple[int, Window]]:
    """``count`` (raster index, window) pairs: rasters in proportion to their area, positions uniform."""
    rng = np.random.default_rng(seed)
    areas = np.asarray([h * w for h, w in sizes], dtype=np.float64)
    picks = rng.choice(len(sizes), size=count, p=areas / areas.sum())
    windows = []
    for index in picks.tolist():
        height, width = sizes[index]
        crop_h, crop_w = min(size[0], height), min(size[1], width)
        top = int(rng.integers(0, height - crop_h + 1))
        left = int(rng.integers(0, width - crop_w + 1))
        windows.append((index, (top, top + crop_h, left, left + crop_w)))
    return windows


class RasterWindows(SegDatasetBase):
    """Items from windows of image/mask raster pairs; ``path`` names the image and the window."""

    def __init__(
        self,
        samples: list[Sample],
        windows: list[tuple[int, Window]],
        classes: list[str],
        palette: list[Color],
        transform: Transform | None = None,
        ignore_index: int = 255,
    ):
        self.samples = samples
        self.windows = windows  # (sample index, window)
        self.classes, self.palette = list(classes), list(palette)
        self.transform = transform if transform is not None else build_eval_transform()
        self.ignore_index = ignore_index

    def __len__(self) -> int:
        return len(self.windows)

    def describe(self, index: int) -> str:
        sample, window = self.windows[index]
        return f"{self.samples[sample].image} at {describe_window(window)}"

    def image_size(self, index: int) -> tuple[int, int]:
        top, bottom, left, right = self.windows[index][1]
        return bottom - top, right - left

    def load_image(self, index: int) -> np.ndarray:
        sample, window = self.windows[index]
        try:
            with raster_env():
                image = RasterImage(self.samples[sample].image)
                try:
                    return image.read(window)
                finally:
                    image.close()
        except ValueError as error:
            raise DataError(str(error), self.samples[sample].image) from None

    def load_mask(self, index: int) -> np.ndarray:
        sample, window = self.windows[index]
        path = self.samples[sample].mask
        return self.samples[sample].decoder(read_labels(path, window), f"{path} at {describe_window(window)}")


DEFAULTS = conf_values("data/raster")  # the windows' size, count and seed, as conf/data/raster.yaml sets them


class RasterLayout(FolderLayout):
    """The ``folder`` layout with TIFF rasters, read by window (see the module docstring)."""

    name = "raster"
    layout = (
        "images/<split>/<stem>.tif and masks/<split>/<stem><mask_suffix>.tif (uint8 class ids, 255 = "
        "ignore) on the same pixel grid (size, CRS, transform), or images/ + masks/ with <split>.txt stem "
        "lists; optional classes.json"
    )

    def __init__(
        self,
        root: str | Path,
        classes: list[str] | None = None,
        mask_values: dict[int, int] | None = None,
        mask_suffix: str = "",
        window_size: Sequence[int] = DEFAULTS["window_size"],
        windows_per_split: int = DEFAULTS["windows_per_split"],
        sample_splits: Sequence[str] = DEFAULTS["sample_splits"],
        seed: int = DEFAULTS["seed"],
    ):
        super().__init__(root, classes, "index", mask_values, mask_suffix)
        self.window_size = (int(window_size[0]), int(window_size[-1]))
        self.windows_per_split = int(windows_per_split)
        self.sample_splits = list(sample_splits)
        self.seed = int(seed)

    def _label_map(self, mask_values: dict[int, int] | None) -> LabelMap:
        """The folder's table, without its 0/255 guard: a window of background and ignore is normal."""
        if mask_values is not None:
            return super()._label_map(mask_values)
        identity = {**{i: i for i in range(len(self.classes))}, self.ignore_index: self.ignore_index}
        return LabelMap(identity, self.name, self.ignore_index, check_binary=False)

    def samples(self, split: str) -> list[Sample]:
        """The split's pairs; every image must be a TIFF on the same grid as its mask (one DataError
        lists every pair that is not)."""
        pairs = [
            Sample(s.image, s.mask.with_suffix(".tif") if not s.mask.is_file() else s.mask, s.decoder)
            for s in super().samples(split)
        ]
        problems = []
        for pair in pairs:
            if not is_raster(pair.image):
                problems.append(f"image {pair.image} is not a TIFF raster (.tif, .tiff)")
            elif not pair.mask.is_file():
                problems.append(f"image {pair.image} has no mask: expected {pair.mask}")
            else:
                try:
                    with raster_env():
                        check_pair(pair.image, pair.mask)
                except (ValueError, RasterioError) as error:
                    problems.append(str(error))
        if problems:
            raise DataError(f"split {split!r} of dataset 'raster': " + "; ".join(problems), self.root)
        return pairs

    def dataset(self, split: str, transform: Transform | None = None) -> RasterWindows:
        samples = self.samples(split)
        if not samples:
            raise DataError(
                f"split {split!r} of dataset 'raster' at {self.root} is empty; expected {self.layout}"
            )
        sizes = [raster_size(sample.image) for sample in samples]
        if split in self.sample_splits:
            seed = [self.seed, *split.encode()]
            windows = random_windows(sizes, self.window_size, self.windows_per_split, seed)
        else:
            windows = [
                (index, window)
                for index, (height, width) in enumerate(sizes)
                for window in grid_windows(height, width, self.window_size)
            ]
        return RasterWindows(samples, windows, self.classes, self.palette, transform, self.ignore_index)


__all__ = ["RasterLayout", "RasterWindows", "grid_windows", "random_windows", "read_labels"]
