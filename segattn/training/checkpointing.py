"""How Lightning writes segattn's checkpoints: crash-safe (``AtomicCheckpointIO``), with a ``last.ckpt`` after
every epoch (``ResumableModelCheckpoint``).

After a crash ``ckpt_path=last`` thus resumes from the latest epoch, not the latest improvement: Lightning
(2.5 on) writes last.ckpt only in a step that saved a top-k checkpoint, so with ``monitor=val/mIoU,
save_top_k=1`` a run whose mIoU stalls for ten epochs and then dies would resume ten epochs back.
``check_monitor`` refuses a misspelt ``monitor`` before anything is built; Lightning finds it only at the end
of the first epoch, having saved nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint
from pytorch_lightning.plugins.io import TorchCheckpointIO

from ..checkpoints.atomic import atomic_save
from ..errors import ConfigError
from ..evaluation.metrics import SUMMARY_KEYS

# What a run logs that a callback can monitor: SegmentationModule.log_scores (every validation) and its
# training step.
MONITORED = (*(f"val/{name}" for name in (*SUMMARY_KEYS, "mAP")), "train/loss", "train/lr")


def check_monitor(key: str, callback: type, options: Mapping[str, Any]) -> None:
    """Refuse a ModelCheckpoint or EarlyStopping entry ``key`` (``callbacks.model_checkpoint``) whose
    ``monitor`` is not a metric the run logs (``MONITORED``): a ConfigError naming the key."""
    monitor = options.get("monitor")
    if not issubclass(callback, (ModelCheckpoint, EarlyStopping)) or monitor is None:
        return
    if monitor not in MONITORED:
        raise ConfigError(
            f"{key}.monitor={monitor}: the run does not log this metric; expected one of "
            f"{', '.join(MONITORED)}"
        )


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's torch checkpoint IO with crash-safe writes for local paths (remote URLs keep
    Lightning's fsspec transaction)."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any | None = None
    ) -> None:
        if storage_options is not None or "://" in str(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        atomic_save(checkpoint, path)


class ResumableModelCheckpoint(ModelCheckpoint):
    """Lightning's ModelCheckpoint, plus a last.ckpt at each epoch-end save point that saved nothing, and
    ``best_step``: the optimizer step of the best score (None before one)."""

    best_step: int | None = None
    noted_score: Any = None  # the best score best_step belongs to

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if self._should_save_on_train_epoch_end(trainer):
            self.save_last_if_missed(trainer)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if not self._should_save_on_train_epoch_end(trainer):
            self.save_last_if_missed(trainer)

    def _save_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        """Note ``best_step`` when the best score is new since the last save, before the state is saved."""
        if self.best_model_score is not self.noted_score:
            self.best_step, self.noted_score = trainer.global_step, self.best_model_score
        super()._save_checkpoint(trainer, filepath)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "best_step": self.best_step}

    def save_last_if_missed(self, trainer: pl.Trainer) -> None:
        """Write last.ckpt unless a checkpoint (and with it last.ckpt) was already saved at this step."""
        if self.save_last and not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the best / top-k bookkeeping only from a checkpoint of this very checkpoint folder.

        Lightning would restore ``best_model_path`` from a copy of another run's last.ckpt: a file of the
        other run, which may have overwritten or deleted it, so the test step and the summary would use
        another model's weights. A run resumed from another folder starts its top-k from nothing."""
        if state_dict.get("dirpath", self.dirpath) == self.dirpath:
            super().load_state_dict(state_dict)
            self.best_step, self.noted_score = state_dict.get("best_step"), self.best_model_score

    def save_last_now(self, trainer: pl.Trainer) -> str:
        """Write last.ckpt now, whatever the schedule, and return its path: a preempted run's state between
        two steps, so resuming continues at the next one."""
        self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
        return self.last_model_path
