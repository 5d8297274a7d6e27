"""W&B callbacks: the validation panel (``WandbValidationPanel``) and what a finished run holds
(``WandbRunRecord``). Rank zero only; silent without a W&B logger."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytorch_lightning as pl
from pytorch_lightning.loggers import WandbLogger
from torch import Tensor

from .rundir import environment


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


def rank_zero_wandb(trainer: pl.Trainer) -> WandbLogger | None:
    """The trainer's W&B logger on rank zero outside the sanity check; None elsewhere."""
    return None if not trainer.is_global_zero or trainer.sanity_checking else wandb_logger(trainer)


def at_image_size(labels: Tensor, image_size: tuple[int, int], step: int) -> np.ndarray:
    """The labels under the pixels ``image[::step, ::step]`` keeps, as int64: nearest by pixel centre, so
    masks larger than the image (``data.downsample``) come out at the panel image's size."""
    height, width = image_size
    rows = ((np.arange(0, height, step) + 0.5) * labels.shape[0] / height).astype(np.int64)
    cols = ((np.arange(0, width, step) + 0.5) * labels.shape[1] / width).astype(np.int64)
    return labels.cpu().numpy()[np.ix_(rows, cols)].astype(np.int64)


def per_class_rows(classes: list[str], scores: dict[str, Any]) -> list[list[Any]]:
    """[class, IoU, Acc] per class, an undefined score as an empty cell."""
    return [
        [name, finite_or_none(scores["IoU"][name]), finite_or_none(scores["Acc"][name])] for name in classes
    ]


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
            size = (image.shape[-2], image.shape[-1])
            self.samples.append(
                (
                    to_uint8_image(image[:, ::step, ::step], record.mean, record.std),
                    at_image_size(mask, size, step),
                    at_image_size(pred, size, step),
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
            rows = per_class_rows(record.classes, scores)
            logger.log_table(
                "val/per_class", columns=["class", "IoU", "Acc"], data=rows, step=trainer.global_step
            )
        self.samples = []


class WandbRunRecord(pl.Callback):
    """What a W&B run holds for its later readers, beside the logged curves.

    The run config gets ``environment`` (versions, git commit); the run summary the checkpoint callback's best
    ``monitor`` score and its ``best_step`` (W&B would keep the last); each test ``test/per_class`` and
    ``test/confusion`` (pixel counts). With ``log_model`` the best checkpoint (else the last) becomes artifact
    ``model-<run id>``, logged here because Lightning's ``log_model`` refuses an offline logger."""

    def __init__(self, log_model: bool = True) -> None:
        self.log_model = log_model

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        logger = rank_zero_wandb(trainer)
        if logger is not None:
            logger.experiment.config.update({"environment": environment()}, allow_val_change=True)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.write_best(trainer)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.write_best(trainer)
        logger = rank_zero_wandb(trainer)
        checkpoint = trainer.checkpoint_callback
        path = getattr(checkpoint, "best_model_path", "") or getattr(checkpoint, "last_model_path", "")
        if logger is None or not self.log_model or not path:
            return
        import wandb

        score = getattr(checkpoint, "best_model_score", None)
        metadata = {"monitor": checkpoint.monitor, "score": None if score is None else float(score)}
        artifact = wandb.Artifact(f"model-{logger.experiment.id}", type="model", metadata=metadata)
        artifact.add_file(path, policy="immutable")  # read where it is, not copied to a staging folder
        logger.experiment.log_artifact(artifact, aliases=["best" if score is not None else "last"])

    def write_best(self, trainer: pl.Trainer) -> None:
        """The checkpoint callback's best score and step into the run summary."""
        logger = rank_zero_wandb(trainer)
        checkpoint = trainer.checkpoint_callback
        score = getattr(checkpoint, "best_model_score", None)
        if logger is not None and score is not None:
            best_step = getattr(checkpoint, "best_step", None)
            logger.experiment.summary.update({checkpoint.monitor: float(score), "best_step": best_step})

    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        logger = rank_zero_wandb(trainer)
        if logger is None or not pl_module.test_scores:
            return
        import wandb

        classes = pl_module.record.classes
        rows = per_class_rows(classes, pl_module.test_scores)
        cells = [
            [classes[label], classes[pred], int(count)]
            for (label, pred), count in np.ndenumerate(pl_module.test_confusion.numpy())
            if count
        ]
        table = wandb.Table(columns=["Actual", "Predicted", "nPredictions"], data=cells)
        fields = {name: name for name in table.columns}
        chart = wandb.plot_table(
            "wandb/confusion_matrix/v1", table, fields, {"title": "test confusion (pixels)"}
        )
        logger.log_table("test/per_class", columns=["class", "IoU", "Acc"], data=rows)
        logger.experiment.log({"test/confusion": chart})
