"""Callbacks for W&B: a validation panel of images with ground-truth / prediction mask overlays and
the per-class IoU table. Rank zero only; silent without a W&B logger."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytorch_lightning as pl
from pytorch_lightning.loggers import WandbLogger
from torch import Tensor


def to_uint8_image(image: Tensor, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """Undo the normalisation of a [3, H, W] image (mean/std on the 0..1 scale) → uint8 [H, W, 3]."""
    pixels = image.detach().float().cpu().numpy().transpose(1, 2, 0) * np.asarray(std) + np.asarray(mean)
    return (pixels * 255).clip(0, 255).round().astype(np.uint8)


def finite_or_none(value: float) -> float | None:
    """NaN (a class absent from labels and predictions) as an empty table cell."""
    return None if math.isnan(value) else value


def wandb_logger(trainer: pl.Trainer) -> WandbLogger | None:
    """The trainer's W&B logger, if it has one."""
    return next((logger for logger in trainer.loggers if isinstance(logger, WandbLogger)), None)


class WandbValidationPanel(pl.Callback):
    """Every ``every_n_epochs`` validations, log ``num_images`` validation images with interactive
    ``ground_truth`` / ``prediction`` mask overlays, and a table of per-class IoU / Acc.

    Images larger than ``max_size`` on their long side are subsampled (nearest) to keep runs light.
    """

    def __init__(self, every_n_epochs: int = 1, num_images: int = 4, max_size: int = 512) -> None:
        if every_n_epochs < 1 or num_images < 0:
            raise ValueError(f"every_n_epochs={every_n_epochs} must be >= 1, num_images={num_images} >= 0")
        self.every_n_epochs = every_n_epochs
        self.num_images = num_images
        self.max_size = max_size
        self.samples: list[tuple[np.ndarray, np.ndarray, np.ndarray, str]] = []

    def active(self, trainer: pl.Trainer) -> bool:
        return (
            trainer.is_global_zero
            and not trainer.sanity_checking
            and (trainer.current_epoch + 1) % self.every_n_epochs == 0
            and wandb_logger(trainer) is not None
        )

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.samples = []

    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if len(self.samples) >= self.num_images or not self.active(trainer):
            return
        record = pl_module.record
        for index in range(min(len(batch["image"]), self.num_images - len(self.samples))):
            image, mask, pred = batch["image"][index], batch["mask"][index], outputs["preds"][index]
            top = outputs.get("band_start", 0)  # trainer=spatial: the rows this process predicted
            image, mask = image[:, top : top + pred.shape[0]], mask[top : top + pred.shape[0]]
            step = max(1, math.ceil(max(image.shape[-2:]) / self.max_size))
            self.samples.append(
                (
                    to_uint8_image(image[:, ::step, ::step], record.mean, record.std),
                    mask[::step, ::step].cpu().numpy().astype(np.int64),
                    pred[::step, ::step].cpu().numpy().astype(np.int64),
                    str(batch["path"][index]) if "path" in batch else "",
                )
            )

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.active(trainer):
            return
        logger = wandb_logger(trainer)
        record = pl_module.record
        labels = {index: name for index, name in enumerate(record.classes)}
        labels[record.ignore_index] = "ignore"
        if self.samples:
            images, masks, preds, paths = zip(*self.samples, strict=True)
            overlays = [
                {
                    "ground_truth": {"mask_data": mask, "class_labels": labels},
                    "prediction": {"mask_data": pred, "class_labels": labels},
                }
                for mask, pred in zip(masks, preds, strict=True)
            ]
            logger.log_image(
                "val/examples", list(images), step=trainer.global_step, masks=overlays, caption=paths
            )
        scores = pl_module.val_scores
        if scores:
            rows = [
                [name, finite_or_none(scores["IoU"][name]), finite_or_none(scores["Acc"][name])]
                for name in record.classes
            ]
            logger.log_table(
                "val/per_class", columns=["class", "IoU", "Acc"], data=rows, step=trainer.global_step
            )
        self.samples = []
