"""What every dataset shares: the item dict, image/mask pairing checks, and the on-disk layout protocol."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch.utils.data import Dataset

from ..images import IGNORE_INDEX, Color, DataError, read_image, read_image_size
from .transforms import build_eval_transform

Transform = Callable[..., dict[str, Any]]  # albumentations-style: transform(image=, mask=) -> dict


class MaskDecoder(Protocol):
    """Reads a mask file and returns train ids (uint8 [H, W]); LabelMap and ColorMap implement it."""

    def read(self, path: str | Path) -> np.ndarray: ...


@dataclass(frozen=True)
class Sample:
    """One image file, the mask file that should label it (it may be missing), and how to decode it."""

    image: Path
    mask: Path
    decoder: MaskDecoder


class SegDatasetBase(Dataset):
    """Items ``{"image": float [3, H, W], "mask": long [H, W], "path": str}`` from ``load(index)``.

    Subclasses provide ``load_image``/``load_mask`` (uint8 arrays) and ``describe`` (the item's path);
    the transform (albumentations, ending with Normalize; full-resolution ImageNet normalisation when
    none is given) turns the arrays into the normalised item.
    """

    classes: list[str]
    palette: list[Color]
    ignore_index: int = IGNORE_INDEX
    transform: Transform

    def load_image(self, index: int) -> np.ndarray:
        """RGB uint8 [H, W, 3]."""
        raise NotImplementedError

    def load_mask(self, index: int) -> np.ndarray:
        """Train ids uint8 [H, W] (ignore index included)."""
        raise NotImplementedError

    def describe(self, index: int) -> str:
        """The path reported with the item and in errors."""
        raise NotImplementedError

    def image_size(self, index: int) -> tuple[int, int]:
        """(height, width) of item ``index``'s image before the transform; datasets of files read it from
        the header without decoding (``data.crop_size=null`` checks every training image's size)."""
        height, width = self.load_image(index).shape[:2]
        return int(height), int(width)

    def check_sizes(self, index: int, image: np.ndarray, mask: np.ndarray) -> None:
        """Raise DataError unless image and mask cover the same pixel grid."""
        if image.shape[:2] != mask.shape:
            (h, w), (mh, mw) = image.shape[:2], mask.shape
            raise DataError(
                f"image {self.describe(index)} is {w}x{h} but its mask is {mw}x{mh}; they must match",
                self.describe(index),
            )

    def load(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """The checked (image, mask) pair before any transform."""
        image, mask = self.load_image(index), self.load_mask(index)
        self.check_sizes(index, image, mask)
        return image, mask

    def __getitem__(self, index: int) -> dict[str, Any]:
        image, mask = self.load(index)
        out = self.transform(image=image, mask=mask)
        return self.item(index, out["image"], out["mask"])

    def item(self, index: int, image: np.ndarray, mask: np.ndarray) -> dict[str, Any]:
        """The item of a transformed image ([H, W, 3] float) and mask ([H, W] ids)."""
        return {
            "image": torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1))),
            "mask": torch.from_numpy(mask.astype(np.int64)),
            "path": self.describe(index),
        }


class SegDataset(SegDatasetBase):
    """A list of image/mask file pairs."""

    def __init__(
        self,
        samples: list[Sample],
        classes: list[str],
        palette: list[Color],
        transform: Transform | None = None,
        ignore_index: int = IGNORE_INDEX,
    ):
        self.samples = samples
        self.classes = list(classes)
        self.palette = list(palette)
        self.transform = transform if transform is not None else build_eval_transform()
        self.ignore_index = ignore_index

    def __len__(self) -> int:
        return len(self.samples)

    def describe(self, index: int) -> str:
        return str(self.samples[index].image)

    def load_image(self, index: int) -> np.ndarray:
        return read_image(self.samples[index].image)

    def image_size(self, index: int) -> tuple[int, int]:
        return read_image_size(self.samples[index].image)

    def load_mask(self, index: int) -> np.ndarray:
        sample = self.samples[index]
        if not sample.mask.is_file():
            raise DataError(f"image {sample.image} has no mask: expected {sample.mask}", sample.image)
        return sample.decoder.read(sample.mask)


class DataSource:
    """A dataset family bound to a root: class names and palette up front, datasets per split on demand."""

    name: str
    classes: list[str]
    palette: list[Color]
    ignore_index: int = IGNORE_INDEX

    def dataset(self, split: str, transform: Transform | None = None) -> SegDatasetBase:
        """The dataset of one split (a DataError names what is missing or empty)."""
        raise NotImplementedError


class FileLayout(DataSource):
    """A dataset stored as files under ``root``; subclasses list each split's samples."""

    layout: str  # one-line description of the expected tree, shown in errors

    def __init__(self, root: str | Path):
        self.root = Path(root).expanduser()

    def samples(self, split: str) -> list[Sample]:
        """The (image, mask) pairs of ``split``, sorted by image path."""
        raise NotImplementedError

    def require_dir(self, path: Path) -> Path:
        """``path`` if it is a folder, else a DataError that shows the expected layout."""
        if not path.is_dir():
            raise DataError(
                f"dataset {self.name!r}: folder {path} does not exist; expected in data.root: {self.layout}",
                path,
            )
        return path

    def dataset(self, split: str, transform: Transform | None = None) -> SegDataset:
        samples = self.samples(split)
        if not samples:
            raise DataError(
                f"split {split!r} of dataset {self.name!r} at {self.root} is empty; expected: {self.layout}",
                self.root,
            )
        return SegDataset(samples, self.classes, self.palette, transform, self.ignore_index)
