"""How Lightning writes segattn's checkpoints: crash-safe (``AtomicCheckpointIO``, through
``checkpoints.atomic``), and with a ``last.ckpt`` after every epoch (``ResumableModelCheckpoint``), so that
``ckpt_path=last`` after a crash resumes from the latest epoch rather than from the latest improvement.

Since Lightning 2.5, ``save_last=True`` writes last.ckpt only when a top-k checkpoint was saved in the
same step: with ``monitor=val/mIoU, save_top_k=1`` a run whose mIoU stalls for ten epochs and then dies
would resume ten epochs back.

A checkpoint or early-stopping callback's ``monitor`` is checked against the metrics the run logs
(``check_monitor``) before anything is built: Lightning finds a misspelt one only at the end of the first
epoch, and saves nothing.
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
    """The ``monitor`` of config entry ``key`` (``callbacks.model_checkpoint``), when its class is a
    ModelCheckpoint or an EarlyStopping, names a metric the run logs (``MONITORED``); a ConfigError naming
    the key otherwise."""
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
        """Every save: a best score new since the last one was scored at this step, which the saved
        checkpoint's state then holds too."""
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

        Lightning restores ``best_model_path`` even when the checkpoint was written in another folder (a
        copy of another run's last.ckpt): that file belongs to the other run, which may have overwritten
        or deleted it since, and the test step and the summary would then use another model's weights.
        A run resumed from another folder starts its top-k from nothing, so its test step uses only its
        own checkpoints (or its final weights)."""
        if state_dict.get("dirpath", self.dirpath) == self.dirpath:
            super().load_state_dict(state_dict)
            self.best_step, self.noted_score = state_dict.get("best_step"), self.best_model_score

    def save_last_now(self, trainer: pl.Trainer) -> str:
        """Write last.ckpt at this very step, whatever the schedule (a preempted run's final state, taken
        between two steps so that resuming continues at the next one). Returns its path."""
        self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
        return self.last_model_path
