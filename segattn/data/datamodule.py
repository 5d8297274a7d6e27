"""SegDataModule: a dataset by name, its train/eval pipelines and DataLoaders, from flat config kwargs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from ..images import IGNORE_INDEX, IMAGENET_MEAN, IMAGENET_STD, DataError, as_hw
from .base import SegDatasetBase
from .registry import build_source
from .resumable import EpochPosition, ResumableDataLoader
from .scan import scan_dataset
from .transforms import (
    WorkerSeeder,
    build_eval_transform,
    build_train_transform,
    reseed_transform,
    stream_seed,
)


def seg_collate(batch: list[dict[str, Any]], ignore_index: int = IGNORE_INDEX) -> dict[str, Any]:
    """Stack items, padding smaller ones at the bottom/right: images with 0 (the mean colour after
    normalisation), masks with ``ignore_index`` so padding never counts as a class. Images and masks are
    padded each to their own largest size: masks may be larger (``data.downsample``'s evaluation items)."""
    H = max(item["image"].shape[1] for item in batch)
    W = max(item["image"].shape[2] for item in batch)
    mask_h = max(item["mask"].shape[0] for item in batch)
    mask_w = max(item["mask"].shape[1] for item in batch)
    images = torch.zeros(len(batch), 3, H, W, dtype=batch[0]["image"].dtype)
    masks = torch.full((len(batch), mask_h, mask_w), ignore_index, dtype=torch.long)
    for i, item in enumerate(batch):
        _, h, w = item["image"].shape
        images[i, :, :h, :w] = item["image"]
        masks[i, : item["mask"].shape[0], : item["mask"].shape[1]] = item["mask"]
    return {"image": images, "mask": masks, "path": [item["path"] for item in batch]}


def whole_image_collate(
    batch: list[dict[str, Any]], ignore_index: int = IGNORE_INDEX, size_divisor: int = 1
) -> dict[str, Any]:
    """Stack whole images of one size (``data.crop_size=null``), padded at the bottom/right to a multiple of
    ``size_divisor`` (the model's stride): images with 0, masks with ``ignore_index``. A batch of mixed
    sizes is a ValueError naming two of them."""
    sizes = {tuple(item["image"].shape[1:]): item["path"] for item in batch}
    if len(sizes) > 1:
        (size, path), (other, other_path) = list(sizes.items())[:2]
        raise ValueError(
            f"data.crop_size=null trains on whole images, but a batch holds images of {list(size)} ({path}) "
            f"and {list(other)} ({other_path}) pixels; whole-image batches need one size: set "
            "data.batch_size=1, or data.crop_size=[H,W] to train on crops"
        )
    (height, width), step = next(iter(sizes)), size_divisor
    padded_h, padded_w = -(-height // step) * step, -(-width // step) * step
    images = torch.zeros(len(batch), 3, padded_h, padded_w, dtype=batch[0]["image"].dtype)
    masks = torch.full((len(batch), padded_h, padded_w), ignore_index, dtype=torch.long)
    for i, item in enumerate(batch):  # [3, H, W] -> top left of [3, padded_h, padded_w]
        images[i, :, :height, :width] = item["image"]
        masks[i, :height, :width] = item["mask"]
    return {"image": images, "mask": masks, "path": [item["path"] for item in batch]}


class SegDataModule(pl.LightningDataModule):
    """Train/val/test loaders for dataset ``name`` under ``root``.

    Sizes are [height, width]; ``mean``/``std`` apply to RGB/255. Keys that are not constructor
    arguments are the dataset family's options (e.g. ``image_size`` for synthetic, ``mask_format`` for
    folder). Class names, palette and ignore index are known right after construction; datasets are
    built in ``setup``, and with ``validate=True`` every file of the needed splits is checked first.
    ``num_classes`` is optional: the dataset's classes (e.g. a folder's classes.json) set the count, and
    a given value only guards against training with the wrong number, so it must agree.
    Shuffling is left to the DataLoader so Lightning can swap in a DistributedSampler under DDP.

    ``crop_size=None`` (``data.crop_size=null``) trains on whole images: no random scale or crop (flips,
    rotation and colour still apply; a dataset read at ``downsample`` is shrunk first), each batch padded
    to a multiple of ``size_divisor`` (the training run sets the model's stride) and made of images of
    one size; ``whole_image_sizes`` refuses a split of mixed sizes when ``batch_size`` > 1.

    ``augment`` (``data.augment``): albumentations transforms, a list by ``_target_`` or albumentations'
    serialised form, that replace the flips, rotation and colour ``hflip``, ``vflip``, ``rotate`` and
    ``photometric`` set; checked here, so a misspelt transform or argument is refused before anything is
    built (``transforms.build_augment``).
    """

    def __init__(
        self,
        name: str = "synthetic",
        root: str | Path | None = None,
        num_classes: int | None = None,
        batch_size: int = 8,
        val_batch_size: int = 1,
        num_workers: int = 0,
        persistent_workers: bool = False,
        pin_memory: bool = False,
        crop_size: int | Sequence[int] | None = (512, 512),
        base_size: Sequence[int] | None = None,
        ratio_range: Sequence[float] = (0.5, 2.0),
        cat_max_ratio: float = 0.75,
        hflip: float = 0.5,
        vflip: float = 0.0,
        rotate: float = 0.0,
        photometric: bool = True,
        augment: Sequence[Mapping[str, Any]] | Mapping[str, Any] | None = None,
        eval_short_side: int | None = None,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        train_split: str = "train",
        val_split: str = "val",
        test_split: str = "test",
        validate: bool = False,
        size_divisor: int = 1,
        **options: Any,
    ):
        super().__init__()
        self.name = name
        self.source = build_source(name, root, **options)
        self.classes = list(self.source.classes)
        self.palette = [tuple(c) for c in self.source.palette]
        self.ignore_index = self.source.ignore_index
        self.num_classes = len(self.classes)
        if num_classes is not None and num_classes != self.num_classes:
            raise ValueError(
                f"data.num_classes={num_classes} but dataset {name!r}"
                f"{'' if root is None else f' at {root}'} has {self.num_classes} classes "
                f"({', '.join(self.classes[:12])}{', ...' if self.num_classes > 12 else ''}); "
                f"set data.num_classes={self.num_classes}"
            )
        self.mean, self.std = tuple(mean), tuple(std)
        self.batch_size, self.val_batch_size = batch_size, val_batch_size
        self.num_workers = num_workers
        self.persistent_workers = persistent_workers and num_workers > 0
        self.pin_memory = pin_memory
        self.splits = {"train": train_split, "val": val_split, "test": test_split}
        self.validate = validate
        self.crop_size = None if crop_size is None else as_hw(crop_size, "data.crop_size")  # parsed once
        self.downsample = int(getattr(self.source, "downsample", 1))  # the shrink of a folder dataset
        self.ratio_range = list(ratio_range)
        if crop_size is None and base_size is not None:
            raise ValueError(
                f"data.base_size={list(base_size)} with data.crop_size=null: whole images are trained at "
                "their own size; set data.base_size=null (data.downsample shrinks a folder dataset), or "
                "data.crop_size=[H,W] to train on rescaled crops"
            )
        self.size_divisor = size_divisor  # whole-image batches are padded to a multiple of it
        self.reads_windows = bool(getattr(self.source, "reads_windows", False))  # crops read as windows
        self.train_transform = build_train_transform(
            self.crop_size, ratio_range, base_size, cat_max_ratio, hflip, photometric, mean, std,
            self.ignore_index, vflip, rotate, cropped=self.reads_windows, augment=augment,
        )  # fmt: skip
        self.eval_transform = build_eval_transform(eval_short_side, mean, std)
        self.datasets: dict[str, SegDatasetBase] = {}
        self.train_position = EpochPosition()  # saved in checkpoints: a preempted run resumes mid-epoch

    def setup(self, stage: str | None = None) -> None:
        """Build the datasets ``stage`` needs (all three for None). With ``validate`` every file of those
        splits is read first and one DataError lists every problem; otherwise a bad sample fails when
        it is loaded, with an error naming its file."""
        roles = {"fit": ["train", "val"], "validate": ["val"], "test": ["test"], "predict": []}.get(
            stage or "", ["train", "val", "test"]
        )
        problems = []
        for role in roles:
            if role in self.datasets:
                continue
            transform = self.train_transform if role == "train" else self.eval_transform
            try:
                if role == "train" and self.reads_windows:
                    self.datasets[role] = self.source.window_dataset(
                        self.splits[role], transform, self.crop_size, self.ratio_range
                    )
                else:
                    self.datasets[role] = self.source.dataset(self.splits[role], transform)
            except DataError as err:
                if not self.validate:
                    raise
                problems.append(str(err))
                continue
            if self.validate:
                problems += scan_dataset(self.datasets[role], self.splits[role]).problems
        if problems:
            shown = problems[:50] + ([f"... and {len(problems) - 50} more"] if len(problems) > 50 else [])
            raise DataError(
                f"data.validate found {len(problems)} problem(s) in dataset {self.name!r}:\n  - "
                + "\n  - ".join(shown)
                + f"\nSee `python -m segattn.doctor data={self.name} data.root=...` for the full report."
            )

    def train_image_sizes(self) -> dict[tuple[int, int], list[str]]:
        """The training images by (height, width) as the model sees them before cropping or padding (after
        ``downsample``; read from the file headers), each size with the images that have it. An image whose
        sides ``downsample`` does not divide is a ValueError naming it."""
        if "train" not in self.datasets:
            self.setup("fit")
        dataset = self.datasets["train"]
        sizes: dict[tuple[int, int], list[str]] = {}
        for index in range(len(dataset)):
            sizes.setdefault(dataset.image_size(index), []).append(dataset.describe(index))
        return sizes

    def whole_image_sizes(self) -> dict[tuple[int, int], list[str]]:
        """``crop_size=None``: ``train_image_sizes``. With ``batch_size`` > 1 a split of several sizes is
        one ValueError naming the sizes and the settings that fix it."""
        sizes = self.train_image_sizes()
        if self.batch_size > 1 and len(sizes) > 1:
            ranked = sorted(sizes.items(), key=lambda entry: -len(entry[1]))
            shown = ", ".join(f"{list(size)} ({len(paths)}, e.g. {paths[0]})" for size, paths in ranked[:3])
            more = f" and {len(ranked) - 3} more" if len(ranked) > 3 else ""
            raise ValueError(
                f"data.crop_size=null with data.batch_size={self.batch_size}: a batch of whole images needs "
                f"one size, but split {self.splits['train']!r} has {len(sizes)} image sizes [H, W]: "
                f"{shown}{more}; set data.batch_size=1, make the images one size, or set "
                "data.crop_size=[H,W] to train on crops"
            )
        return sizes

    def collate(self, role: str) -> Any:
        """The collate function of ``role``'s loader: whole-image batches for training with
        ``crop_size=None``, else every item padded to the largest (``seg_collate``)."""
        if role == "train" and self.crop_size is None:
            divisor = self.size_divisor
            return partial(whole_image_collate, ignore_index=self.ignore_index, size_divisor=divisor)
        return partial(seg_collate, ignore_index=self.ignore_index)

    def _rank(self) -> int:
        trainer = getattr(self, "trainer", None)
        return trainer.global_rank if trainer is not None else 0

    def _loader(self, role: str) -> DataLoader:
        if role not in self.datasets:
            self.setup({"train": "fit", "val": "validate", "test": "test"}[role])
        dataset = self.datasets[role]
        train = role == "train"
        rank = self._rank()
        if train and self.num_workers == 0:  # no worker_init_fn runs in-process: seed the pipeline here
            reseed_transform(dataset, stream_seed(int(torch.randint(2**62, ()).item()), rank))
        batch_size = self.batch_size if train else self.val_batch_size
        resumable = {"position": self.train_position} if train else {}
        return (ResumableDataLoader if train else DataLoader)(
            dataset,
            batch_size=batch_size,
            shuffle=train,
            drop_last=train and len(dataset) >= batch_size,
            num_workers=self.num_workers,
            persistent_workers=self.persistent_workers,
            pin_memory=self.pin_memory,
            collate_fn=self.collate(role),
            worker_init_fn=WorkerSeeder(rank) if self.num_workers > 0 else None,
            **resumable,
        )

    def state_dict(self) -> dict[str, Any]:
        """The train loader's position when a checkpoint is taken mid-epoch (``ResumableDataLoader``);
        nothing at an epoch's end, where resuming starts the next epoch afresh."""
        trainer = getattr(self, "trainer", None)
        handed_out = self.train_position.handed_out
        if trainer is None or not 0 < handed_out < trainer.num_training_batches:
            return {}
        return {"train_position": self.train_position.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Lightning calls this before it builds the train loader when resuming: its first epoch picks up
        where the checkpoint's stopped."""
        self.train_position.load_state_dict(state.get("train_position", {}))

    def train_dataloader(self) -> DataLoader:
        return self._loader("train")

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")
