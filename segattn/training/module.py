"""The LightningModule: training loss, full-resolution validation and test with mmseg metrics,
optimizers, and the segattn section of every checkpoint. The only place (with train.py) that knows about
Lightning."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.loggers import WandbLogger
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from ..checkpoints.resume import restore_rng_state, rng_state
from ..evaluation.average_precision import AveragePrecisionMetric, score_logits
from ..evaluation.metrics import PER_CLASS_KEYS, SUMMARY_KEYS, SegmentationMetric
from ..inference.infer import infer
from ..layers import TRITON, kernel_backend, loss_path
from ..parallel import band_forward
from ..record import ModelRecord
from ..tiling import image_settings
from .chunked_loss import chunked_seg_loss
from .fused_loss import fused_seg_loss
from .spatial import band_group_of, band_loss, share_batch

OptimizerFactory = Callable[[nn.Module], Optimizer]
SchedulerFactory = Callable[[Optimizer, int], LRScheduler]


class SegmentationModule(pl.LightningModule):
    """Trains ``model`` (a Segmentor) with ``criterion``; validates and tests with ``infer(**inference)``
    (``inference``: the ``inference`` config group's values).

    ``record`` (what the model is: its config, classes, palette, normalisation, dataset) is stored in
    checkpoints so the model can be rebuilt and used from the checkpoint alone. ``average_precision``
    ({bins, mean_classes}: ``AveragePrecisionMetric``'s options) sets the per-class AP scored beside IoU.
    ``compile_network`` (``model.compile``) compiles the network in place once, before training
    (``Segmentor.compile``).
    """

    def __init__(
        self,
        model: nn.Module,
        criterion: nn.Module,
        optimizer: OptimizerFactory,
        scheduler: SchedulerFactory,
        record: ModelRecord,
        inference: dict[str, Any] | None = None,
        compile_network: bool = False,
        average_precision: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.criterion = criterion
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.record = record
        self.inference = image_settings(inference or {})  # precision and batch_size are eval's and predict's
        self.val_metric = SegmentationMetric(model.num_classes, record.ignore_index)
        self.test_metric = SegmentationMetric(model.num_classes, record.ignore_index)
        ap_options = {"ignore_index": record.ignore_index, **(average_precision or {})}
        self.val_ap = AveragePrecisionMetric(model.num_classes, **ap_options)
        self.test_ap = AveragePrecisionMetric(model.num_classes, **ap_options)
        self.val_scores: dict[str, Any] = {}  # the latest validation's scores, read by callbacks
        self.test_scores: dict[str, Any] = {}  # the latest test's scores, read by the run summary
        self.test_histograms: dict[str, Tensor] = {}  # the latest test's AP histograms (run_test saves them)
        self.test_confusion = self.test_metric.confusion  # the latest test's confusion matrix (W&B logs it)
        self.compile_network = compile_network
        self.compiled = False
        self.kernel_backend = kernel_backend()  # the loss's path, read once like the model's modules

    def configure_model(self) -> None:
        """Compile once (Lightning calls this hook at every fit/validate), before any strategy wraps the
        model. In place, so checkpoint keys carry no ``_orig_mod.``; default ``dynamic=None``: a new input
        size (whole-image validation) recompiles once with dynamic shapes."""
        if self.compile_network and not self.compiled:
            self.model.compile()
            self.compiled = True

    def forward(self, images: Tensor) -> Tensor:
        return self.model(images)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        group = band_group_of(self._trainer)
        if group is not None:
            return self.band_training_step(share_batch(batch, group), group)
        images, masks = batch["image"], batch["mask"]
        loss, aux_loss = self.head_losses(images, masks)
        group = self.optimizers().param_groups[0]
        logs = {"train/lr": group["lr"] / group.get("lr_scale", 1.0)}  # the scheduled base LR
        if aux_loss is not None:
            logs.update({"train/main_loss": loss, "train/aux_loss": aux_loss})
            loss = loss + self.model.aux_weight * aux_loss
        self.log("train/loss", loss, prog_bar=True, batch_size=images.shape[0])
        self.log_dict(logs, batch_size=images.shape[0])
        return loss

    def head_losses(self, images: Tensor, masks: Tensor) -> tuple[Tensor, Tensor | None]:
        """The criterion on the main and (None without one) auxiliary head's logits. With
        ``loss.chunk_rows`` the heads' logits stay at their own stride and the loss upsamples them row
        chunk by row chunk (``chunked_seg_loss``); on the Triton path (``layers.loss_path``) a
        cross-entropy and Dice loss upsamples and scores them in one fused operator (``fused_seg_loss``);
        otherwise on logits upsampled to the image."""
        chunked = getattr(self.criterion, "chunk_rows", None) is not None
        fused = (
            not chunked
            and getattr(self.criterion, "sums_over_pixels", False)
            and loss_path(self.kernel_backend, images, self.model.num_classes) == TRITON
        )
        if not (chunked or fused):
            logits, aux_logits = self.model.forward_with_aux(images)
            score = functools.partial(self.criterion, target=masks)
        else:
            logits, aux_logits = self.model.forward_with_aux(images, upsample=False)
            size = self.model.padded_size(*images.shape[-2:])
            loss = fused_seg_loss if fused else chunked_seg_loss
            score = functools.partial(loss, self.criterion, target=masks, size=size)
        return score(logits), None if aux_logits is None else score(aux_logits)

    def band_training_step(self, batch: dict[str, Any], group: Any) -> Tensor:
        """``training_step`` on this process's band of each image (``trainer=spatial``): the loss to
        backpropagate is the band's share; the logged loss is the whole image's."""
        logits, aux_logits, band = band_forward(self.model, batch["image"], group, with_aux=True)
        masks = batch["mask"][:, band.start : band.start + logits.shape[2]]
        loss, image_loss = band_loss(self.criterion, logits, aux_logits, self.model.aux_weight, masks, group)
        group_lr = self.optimizers().param_groups[0]
        self.log("train/loss", image_loss, prog_bar=True, batch_size=logits.shape[0])
        self.log("train/lr", group_lr["lr"] / group_lr.get("lr_scale", 1.0), batch_size=logits.shape[0])
        return loss

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> dict[str, Tensor]:
        """Full-resolution prediction (whole image or sliding window); only pixel counts are kept."""
        return self.score_batch(batch, self.val_metric, self.val_ap)

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> dict[str, Tensor]:
        """The test split, predicted and scored exactly as validation is."""
        return self.score_batch(batch, self.test_metric, self.test_ap)

    def score_batch(
        self, batch: dict[str, Any], metric: SegmentationMetric, ap: AveragePrecisionMetric
    ) -> dict[str, Tensor]:
        """Predict and count; under ``trainer=spatial`` each process predicts and counts its band of each
        whole image, and the counts add up over all processes as data-parallel counts do. Masks larger
        than the images (a dataset read at reduced resolution, ``data.downsample``) are scored at their
        own resolution: the logits are resized bilinearly to the mask first."""
        group = band_group_of(self._trainer)
        if group is not None:
            batch = share_batch(batch, group)
            logits, _, band = band_forward(self.model, batch["image"], group)
            masks = batch["mask"][:, band.start : band.start + logits.shape[2]]
            start = band.start
        else:
            logits = infer(self.model, batch["image"], self.model.num_classes, **self.inference)
            masks, start = batch["mask"], 0
        preds = score_logits(logits, masks, metric, ap)
        return {"preds": preds, "band_start": start}

    def on_validation_epoch_end(self) -> None:
        self.val_scores = self.log_scores(self.val_metric, self.val_ap, "val")

    def on_test_epoch_end(self) -> None:
        with self.test_ap.sync_context(), self.test_metric.sync_context():  # summed over all ranks
            self.test_histograms = {
                "positives": self.test_ap.positives.cpu().clone(),
                "negatives": self.test_ap.negatives.cpu().clone(),
            }
            self.test_confusion = self.test_metric.confusion.cpu().clone()
        self.test_scores = self.log_scores(self.test_metric, self.test_ap, "test")

    def log_scores(
        self, metric: SegmentationMetric, ap: AveragePrecisionMetric, prefix: str
    ) -> dict[str, Any]:
        """Log ``<prefix>/mIoU`` etc., ``<prefix>/mAP`` and each class's ``<prefix>/IoU/<class>``, reset both
        metrics, and return the scores with per-class dicts."""
        scores = {**metric.compute(), **ap.compute()}  # summed over all ranks
        metric.reset()
        ap.reset()
        summary_keys, per_class_keys = (*SUMMARY_KEYS, "mAP"), (*PER_CLASS_KEYS, "AP")
        classes = self.record.classes
        self.log_dict({f"{prefix}/{name}": scores[name].float() for name in summary_keys})
        self.log_dict(
            {f"{prefix}/IoU/{name}": iou.float() for name, iou in zip(classes, scores["IoU"], strict=True)}
        )
        return {
            **{name: scores[name].item() for name in summary_keys},
            **{name: dict(zip(classes, scores[name].tolist(), strict=True)) for name in per_class_keys},
        }

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = self.optimizer_factory(self.model)
        scheduler = self.scheduler_factory(optimizer, int(self.trainer.estimated_stepping_batches))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.record.to_checkpoint(checkpoint, wandb_run_id=self.wandb_run_id())
        checkpoint["rng_states"] = rng_state()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if "rng_states" in checkpoint:
            restore_rng_state(checkpoint["rng_states"])

    def wandb_run_id(self) -> str | None:
        """Id of the W&B run this training logs to (None without a W&B logger)."""
        return next((lg.version for lg in self.trainer.loggers if isinstance(lg, WandbLogger)), None)
