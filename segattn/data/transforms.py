"""Albumentations pipelines: mmseg-style training augmentation and full-resolution (or short-side) eval.

Train: RandomResize(ratio_range) → CatMaxRatioCrop → augmentation → Normalize → pad to the crop size
(image 0, i.e. the mean colour after normalisation; mask ignore index). The augmentation is HorizontalFlip
(→ VerticalFlip → Rotate, when set) → photometric distortion, or the albumentations transforms
``data.augment`` names, by ``_target_`` or in albumentations' serialised form (``build_augment``).
Datasets that read crop windows themselves (``windows.py``) get the same pipeline without the resize and
the crop. Whole images (``crop_size=None``, ``data.crop_size=null``): no resize, crop or padding; the
augmentation still applies, and the collate function pads each batch to the model's stride.
Images are resized bilinearly and masks with nearest neighbour, so masks keep their exact label values;
OpenCV's INTER_NEAREST_EXACT samples at pixel centres like INTER_LINEAR (plain INTER_NEAREST is shifted by
up to half a source pixel, which misaligns masks when downscaling).
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import albumentations as A
import cv2
import numpy as np
import torch
from albumentations.augmentations.crops.transforms import BaseCrop
from albumentations.core.transforms_interface import DualTransform

from ..errors import ConfigError, one_line
from ..images import IGNORE_INDEX, IMAGENET_MEAN, IMAGENET_STD


class RandomResize(DualTransform):
    """Keep-ratio rescale by a random factor from ``ratio_range`` (mmseg's Resize with ratio_range).

    With ``base_size`` = (long, short) the image is fitted inside (long·r, short·r), as mmseg's
    ``scale=(2048, 512)``; without it, r multiplies the image's own size.
    """

    def __init__(
        self,
        ratio_range: Sequence[float] = (0.5, 2.0),
        base_size: Sequence[int] | None = None,
        p: float = 1.0,
    ):
        super().__init__(p=p)
        self.ratio_range = (float(ratio_range[0]), float(ratio_range[1]))
        self.base_size = None if base_size is None else (max(base_size), min(base_size))

    def get_params_dependent_on_data(self, params: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
        h, w = params["shape"][:2]
        ratio = self.py_random.uniform(*self.ratio_range)
        if self.base_size is None:
            factor = ratio
        else:
            long, short = self.base_size
            factor = min(long * ratio / max(h, w), short * ratio / min(h, w))
        return {"size": (max(1, round(h * factor)), max(1, round(w * factor)))}

    def apply(self, img: np.ndarray, size: tuple[int, int], **params: Any) -> np.ndarray:
        return cv2.resize(img, (size[1], size[0]), interpolation=cv2.INTER_LINEAR)

    def apply_to_mask(self, mask: np.ndarray, size: tuple[int, int], **params: Any) -> np.ndarray:
        return cv2.resize(mask, (size[1], size[0]), interpolation=cv2.INTER_NEAREST_EXACT)


def max_class_ratio(mask: np.ndarray, ignore_index: int = IGNORE_INDEX) -> float:
    """Share of the most frequent class among labelled pixels; 1.0 when fewer than two classes are present."""
    counts = np.bincount(mask.ravel(), minlength=256)
    counts[ignore_index] = 0
    if np.count_nonzero(counts) < 2:
        return 1.0
    return float(counts.max() / counts.sum())


class CatMaxRatioCrop(BaseCrop):
    """Random crop that avoids crops dominated by one class (mmseg's ``cat_max_ratio``).

    Up to ``max_tries`` random windows; the first whose most frequent class covers less than
    ``cat_max_ratio`` of the labelled pixels (with at least two classes) wins, else the try with the
    smallest such share. The window is clipped to the image; padding happens later.
    """

    def __init__(
        self,
        height: int,
        width: int,
        cat_max_ratio: float = 0.75,
        ignore_index: int = IGNORE_INDEX,
        max_tries: int = 10,
        p: float = 1.0,
    ):
        super().__init__(p=p)
        self.height, self.width = height, width
        self.cat_max_ratio = cat_max_ratio
        self.ignore_index = ignore_index
        self.max_tries = max_tries

    def get_params_dependent_on_data(self, params: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
        H, W = params["shape"][:2]
        h, w = min(self.height, H), min(self.width, W)
        mask = data.get("mask")
        check = mask is not None and self.cat_max_ratio < 1.0
        best: tuple[float, tuple[int, int, int, int]] | None = None
        for _ in range(self.max_tries if check else 1):
            y, x = self.py_random.randint(0, H - h), self.py_random.randint(0, W - w)
            coords = (x, y, x + w, y + h)
            if not check:
                return {"crop_coords": coords}
            ratio = max_class_ratio(mask[y : y + h, x : x + w], self.ignore_index)
            if ratio < self.cat_max_ratio:
                return {"crop_coords": coords}
            if best is None or ratio < best[0]:
                best = (ratio, coords)
        return {"crop_coords": best[1]}


AUGMENT_ENTRY = (
    "a mapping with the _target_ of an albumentations transform and its arguments, e.g. "
    "{_target_: albumentations.HorizontalFlip, p: 0.5}"
)
SERIALISED_ENTRY = "a transform as A.to_dict writes it, {__class_fullname__: <name>, <argument>: <value>}"


def augment_class(key: str, name: str, kinds: tuple[type, ...] = (A.BasicTransform,)) -> type:
    """The albumentations class ``name`` (``HorizontalFlip`` or ``albumentations.HorizontalFlip``), named by
    entry ``key`` of ``data.augment``: a ConfigError naming the key when albumentations has no class of
    ``kinds`` by that name (with the nearest names)."""
    name = name.removeprefix("albumentations.")
    found = getattr(A, name, None)
    if not (isinstance(found, type) and issubclass(found, kinds)):
        names = [n for n, v in vars(A).items() if isinstance(v, type) and issubclass(v, kinds)]
        close = difflib.get_close_matches(name, names, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(f"{key}: albumentations has no transform {name!r}{hint}")
    return found


def check_arguments(where: str, found: type, names: Sequence[str]) -> None:
    """Each of ``names`` is an argument of transform class ``found``: else a ConfigError naming ``where``."""
    takes = inspect.signature(found).parameters
    for name in names:
        if name not in takes:
            raise ConfigError(f"{where}: unexpected argument {name!r}; it takes {', '.join(takes)}")


def check_serialised(key: str, node: Any) -> None:
    """Transform ``node`` of albumentations' serialised form, and each of its ``transforms`` (a OneOf's,
    a Compose's), names an albumentations class and only arguments it takes: else a ConfigError naming it."""
    name = node.get("__class_fullname__") if isinstance(node, Mapping) else None
    if not isinstance(name, str):
        raise ConfigError(f"{key}={node!r}: expected {SERIALISED_ENTRY}")
    found = augment_class(key, name, (A.BasicTransform, A.BaseCompose))
    check_arguments(f"{key} {found.__name__}", found, [n for n in node if n != "__class_fullname__"])
    for index, child in enumerate(node.get("transforms") or []):
        check_serialised(f"{key}.transforms[{index}]", child)


def build_augment(
    entries: Sequence[Mapping[str, Any]] | Mapping[str, Any], key: str = "data.augment"
) -> list[A.BasicTransform | A.BaseCompose]:
    """The transforms ``data.augment`` describes, in its order: a list of entries, each a ``_target_``
    (``albumentations.<Transform>``) and that transform's arguments; or albumentations' own serialised
    pipeline (``A.to_dict``'s ``{__version__, transform: {__class_fullname__: Compose, transforms: [...]}}``),
    checked transform by transform, then read by ``A.from_dict`` as one step. An entry that names no
    transform, an argument a transform does not take or a value it refuses is a ConfigError naming it."""
    if isinstance(entries, Mapping) and "transform" in entries:
        check_serialised(f"{key}.transform", entries["transform"])
        try:
            return [A.from_dict(entries)]
        except (TypeError, ValueError) as error:
            raise ConfigError(f"{key}: albumentations refused it: {one_line(error)}") from None
    if not isinstance(entries, Sequence) or isinstance(entries, str):
        raise ConfigError(
            f"{key}={entries!r}: expected a list of {AUGMENT_ENTRY}; or albumentations' serialised pipeline "
            "(A.to_dict's: __version__, transform); or null for the default"
        )
    transforms = []
    for index, entry in enumerate(entries):
        where = f"{key}[{index}]"
        target = entry.get("_target_") if isinstance(entry, Mapping) else None
        if not isinstance(target, str):
            raise ConfigError(f"{where}={entry!r}: expected {AUGMENT_ENTRY}")
        found = augment_class(where, target)
        where = f"{where} {found.__name__}"
        arguments = {name: value for name, value in entry.items() if name != "_target_"}
        check_arguments(where, found, list(arguments))
        try:
            transforms.append(found(**arguments))
        except (TypeError, ValueError) as error:
            raise ConfigError(f"{where}: refused its arguments: {one_line(error)}") from None
    return transforms


def default_augment(
    hflip: float, vflip: float, rotate: float, photometric: bool, ignore_index: int
) -> list[A.BasicTransform]:
    """The augmentation of ``data.augment=null``: a horizontal flip with probability ``hflip``, a vertical
    flip with ``vflip``, a random rotation of up to ``rotate`` degrees (half the items; corners filled with 0
    and the ignore index), mmseg's photometric distortion (half the items) when ``photometric``."""
    steps: list[A.BasicTransform] = []
    if hflip > 0:
        steps.append(A.HorizontalFlip(p=hflip))
    if vflip > 0:
        steps.append(A.VerticalFlip(p=vflip))
    if rotate > 0:
        steps.append(
            A.Rotate(limit=rotate, border_mode=cv2.BORDER_CONSTANT, fill=0, fill_mask=ignore_index, p=0.5)
        )
    if photometric:
        # mmseg PhotoMetricDistortion ranges: brightness ±32/255, contrast and saturation 0.5..1.5, hue ±18°
        steps.append(A.ColorJitter(brightness=0.125, contrast=0.5, saturation=0.5, hue=0.1, p=0.5))
    return steps


def build_train_transform(
    crop_size: tuple[int, int] | None,
    ratio_range: Sequence[float] = (0.5, 2.0),
    base_size: Sequence[int] | None = None,
    cat_max_ratio: float = 0.75,
    hflip: float = 0.5,
    photometric: bool = True,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
    ignore_index: int = IGNORE_INDEX,
    vflip: float = 0.0,
    rotate: float = 0.0,
    cropped: bool = False,
    augment: Sequence[Mapping[str, Any]] | Mapping[str, Any] | None = None,
) -> A.Compose:
    """The training pipeline; ``crop_size`` is (height, width) (``SegDataModule.crop_size``), or None for
    whole images (no resize, crop or padding: ``ratio_range``, ``base_size``, ``cat_max_ratio`` unused).
    ``augment``: ``data.augment``, the transforms (``build_augment``) that replace the augmentation
    ``default_augment`` builds from ``hflip``, ``vflip``, ``rotate`` and ``photometric``. ``cropped``: the
    dataset has already scaled and cropped (no RandomResize, no crop)."""
    whole = crop_size is None
    h, w = crop_size or (0, 0)
    cropped = cropped or whole
    steps: list[Any] = []
    if not cropped and (base_size is not None or tuple(ratio_range) != (1.0, 1.0)):
        steps.append(RandomResize(ratio_range, base_size))
    if not cropped:
        steps.append(CatMaxRatioCrop(h, w, cat_max_ratio, ignore_index))
    if augment is None:
        steps += default_augment(hflip, vflip, rotate, photometric, ignore_index)
    else:
        steps += build_augment(augment)
    steps.append(A.Normalize(mean=tuple(mean), std=tuple(std)))
    if not whole:
        steps.append(
            A.PadIfNeeded(
                h, w, position="top_left", border_mode=cv2.BORDER_CONSTANT, fill=0, fill_mask=ignore_index
            )
        )
    return A.Compose(steps)


def build_eval_transform(
    short_side: int | None = None,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> A.Compose:
    """Validation/test pipeline: full resolution, or keep-ratio resize to ``short_side`` (mask nearest)."""
    steps: list[Any] = []
    if short_side is not None:
        steps.append(
            A.SmallestMaxSize(
                max_size=short_side,
                interpolation=cv2.INTER_LINEAR,
                mask_interpolation=cv2.INTER_NEAREST_EXACT,
            )
        )
    steps.append(A.Normalize(mean=tuple(mean), std=tuple(std)))
    return A.Compose(steps)


def reseed_transform(dataset: Any, seed: int) -> None:
    """Give the dataset's albumentations pipeline its own random stream (albumentations does not reseed
    itself in DataLoader workers, so forked workers would otherwise repeat each other's augmentations)."""
    transform = getattr(dataset, "transform", None)
    if transform is not None and hasattr(transform, "set_random_seed"):
        transform.set_random_seed(seed)


def stream_seed(*entropy: int) -> int:
    """A 32-bit seed mixing several integers (torch seed, rank) without collisions between them."""
    return int(np.random.SeedSequence([int(e) % 2**64 for e in entropy]).generate_state(1)[0])


class WorkerSeeder:
    """DataLoader ``worker_init_fn``: seeds each worker's pipeline from its torch seed and the DDP rank."""

    def __init__(self, rank: int = 0):
        self.rank = rank

    def __call__(self, worker_id: int) -> None:
        cv2.setNumThreads(0)  # workers are the parallelism; OpenCV threads would oversubscribe the cores
        info = torch.utils.data.get_worker_info()
        reseed_transform(info.dataset, stream_seed(torch.initial_seed(), self.rank))
