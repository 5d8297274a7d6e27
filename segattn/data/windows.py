"""Training crops read as windows of decoded large images, centred on foreground part of the time.

For images far larger than a crop, only the crop's window is read (from ``DecodedCache``'s memory maps) and
resized; the image is never decoded or rescaled whole for a step. Per item: a scale r from ``ratio_range``
(the crop shows crop_size / r cached pixels, resized by r); then, with probability ``foreground_prob``, a
class drawn uniformly among the non-``background`` classes present and one of its pixels
(``DecodedCache.positions``), which lands at a uniformly random spot inside the window; otherwise a uniform
window. The window is clipped to the image and the transform pads the rest (image 0, mask ignore).

Why: lesions such as IDRiD's microaneurysms are 0.1 % of the pixels and the black border outside the eye a
third of the image, so uniform crops are almost all background and a rare class reaches few steps. Drawing the
class first, then a pixel (nnU-Net's foreground oversampling), gives every lesion type the same share of
foreground crops however few pixels it has; the uniform rest keeps the background in proportion, so the model
does not learn that every crop holds a lesion.

The randomness is the transform's Python RNG (``A.Compose.py_random``), seeded per worker and rank by the
DataModule (``transforms.reseed_transform``): crops and augmentations share one stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import cv2
import numpy as np

from ..images import IGNORE_INDEX, Color, indivisible, read_image_size, shrunk_size
from .base import Sample, SegDatasetBase, Transform
from .decoded import DecodedCache


class CachedDataset(SegDatasetBase):
    """Items of samples read through a ``DecodedCache``, images shrunk by ``factor``."""

    def __init__(
        self,
        samples: list[Sample],
        classes: list[str],
        palette: list[Color],
        transform: Transform,
        cache: DecodedCache,
        factor: int = 1,
        ignore_index: int = IGNORE_INDEX,
    ) -> None:
        self.samples, self.classes, self.palette = samples, list(classes), list(palette)
        self.transform, self.cache, self.factor, self.ignore_index = transform, cache, factor, ignore_index

    def __len__(self) -> int:
        return len(self.samples)

    def describe(self, index: int) -> str:
        return str(self.samples[index].image)

    def image_size(self, index: int) -> tuple[int, int]:
        """The image's size shrunk by ``factor``, from the file header; sides ``factor`` does not divide are a
        ValueError (``images.indivisible`` says why)."""
        height, width = read_image_size(self.samples[index].image)
        if problem := indivisible(height, width, self.factor):
            raise ValueError(
                f"data.downsample={self.factor}: training image {self.describe(index)} {problem}; a model "
                f"trained on images shrunk {self.factor}x predicts only such multiples: set a "
                f"data.downsample that divides every training image, or crop the images to multiples of "
                f"{self.factor}"
            )
        return shrunk_size(height, width, self.factor)


class WindowCropDataset(CachedDataset):
    """Training items: random (foreground-centred part of the time) crops of cached, optionally shrunk
    images, followed by ``transform`` (flips, rotation, colour, normalisation, padding to the crop)."""

    def __init__(
        self,
        samples: list[Sample],
        classes: list[str],
        palette: list[Color],
        transform: Transform,
        cache: DecodedCache,
        crop_size: tuple[int, int],
        factor: int = 1,
        ratio_range: Sequence[float] = (1.0, 1.0),
        foreground_prob: float = 0.5,
        background: int = 0,
        ignore_index: int = IGNORE_INDEX,
    ) -> None:
        if not 0.0 <= foreground_prob <= 1.0:
            raise ValueError(f"data.foreground_prob={foreground_prob}; expected a probability in [0, 1]")
        super().__init__(samples, classes, palette, transform, cache, factor, ignore_index)
        self.crop_size = crop_size
        self.ratio_range = (float(ratio_range[0]), float(ratio_range[1]))
        self.foreground_prob, self.background = foreground_prob, background

    def window(self, index: int, height: int, width: int, ratio: float) -> tuple[int, int, int, int]:
        """(top, left, h, w) of the source window for one crop of image ``index`` ([height, width])."""
        rng = self.transform.py_random
        h = min(height, max(1, round(self.crop_size[0] / ratio)))
        w = min(width, max(1, round(self.crop_size[1] / ratio)))
        if rng.random() < self.foreground_prob:
            positions = self.cache.positions(self.samples[index], self.factor)
            present = sorted(c for c in positions if c not in (self.background, self.ignore_index))
            if present:
                chosen = positions[present[rng.randrange(len(present))]]
                y, x = divmod(int(chosen[rng.randrange(len(chosen))]), width)
                top = min(max(y - rng.randrange(h), 0), height - h)
                left = min(max(x - rng.randrange(w), 0), width - w)
                return top, left, h, w
        return rng.randint(0, height - h), rng.randint(0, width - w), h, w

    def __getitem__(self, index: int) -> dict[str, Any]:
        sample = self.samples[index]
        image, mask = self.cache.image(sample, self.factor), self.cache.mask(sample, self.factor)
        self.check_sizes(index, image, mask)
        ratio = self.transform.py_random.uniform(*self.ratio_range)
        top, left, h, w = self.window(index, *mask.shape, ratio)
        image = np.ascontiguousarray(image[top : top + h, left : left + w])
        mask = np.ascontiguousarray(mask[top : top + h, left : left + w])
        if ratio != 1.0:
            size = (max(1, round(w * ratio)), max(1, round(h * ratio)))
            shrink = cv2.INTER_AREA if ratio < 1 else cv2.INTER_LINEAR
            image = cv2.resize(image, size, interpolation=shrink)
            mask = cv2.resize(mask, size, interpolation=cv2.INTER_NEAREST_EXACT)
        out = self.transform(image=image, mask=mask)
        return self.item(index, out["image"], out["mask"])


class WholeImageDataset(CachedDataset):
    """Training items of whole cached images (``data.crop_size=null``), image and mask shrunk by ``factor``,
    then ``transform`` (no scale or crop). The collate function pads a batch to the model's stride."""

    def load_image(self, index: int) -> np.ndarray:
        return np.asarray(self.cache.image(self.samples[index], self.factor))

    def load_mask(self, index: int) -> np.ndarray:
        return np.asarray(self.cache.mask(self.samples[index], self.factor))


class ReducedDataset(CachedDataset):
    """Evaluation items of cached images shrunk by ``factor`` with their full-resolution masks: the model
    predicts at the reduced size and is scored at the original one (the logits are resized to the mask)."""

    def load_image(self, index: int) -> np.ndarray:
        return np.asarray(self.cache.image(self.samples[index], self.factor))

    def load_mask(self, index: int) -> np.ndarray:
        return np.asarray(self.cache.mask(self.samples[index], 1))

    def check_sizes(self, index: int, image: np.ndarray, mask: np.ndarray) -> None:
        expected = tuple(max(1, round(side / self.factor)) for side in mask.shape)
        if image.shape[:2] != expected:
            super().check_sizes(index, image, mask)  # names both sizes

    def __getitem__(self, index: int) -> dict[str, Any]:
        image, mask = self.load(index)
        return self.item(index, self.transform(image=image)["image"], mask)  # the mask keeps its size
