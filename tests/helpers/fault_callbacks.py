"""Test-only fault callbacks that subprocess tests plant into train.py runs through config overrides, as any
callback joins a run: ``+callbacks.raise_at_step._target_=fault_callbacks.RaiseAtStep
+callbacks.raise_at_step.rank=1``. ``reliability_fixtures.train_env`` puts this folder on the job's
PYTHONPATH, so train.py and the DDP processes Lightning launches from it import them."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytorch_lightning as pl

from segattn.images import DataError


class RaiseAtStep(pl.Callback):
    """Rank ``rank`` raises RuntimeError at global step ``step``: a crash on one DDP process."""

    def __init__(self, rank: int, step: int) -> None:
        self.rank, self.step = rank, step

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module, batch, batch_idx: int) -> None:
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            raise RuntimeError(f"planted failure on rank {self.rank} at step {self.step}")


class PoisonBatch(pl.Callback):
    """Rank ``rank`` turns its first image NaN at global step ``step`` and writes the batch's files to
    ``record``: a corrupt sample on one DDP process."""

    def __init__(self, rank: int, step: int, record: str) -> None:
        self.rank, self.step, self.record = rank, step, Path(record)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module, batch, batch_idx: int) -> None:
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            batch["image"][0] = float("nan")
            self.record.write_text(", ".join(batch["path"]))


class ParkAt(pl.Callback):
    """At (epoch, batch) write ``marker`` and sleep: the test kills the process there, mid-epoch. The marker
    appears by rename, so a test polling for it never reads it empty."""

    def __init__(self, epoch: int, batch: int, marker: str, seconds: float = 120.0) -> None:
        self.epoch, self.batch, self.marker, self.seconds = epoch, batch, Path(marker), seconds

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if (trainer.current_epoch, batch_idx) == (self.epoch, self.batch):
            partial = self.marker.with_name(self.marker.name + ".partial")
            partial.write_text(str(trainer.global_step))
            partial.replace(self.marker)
            time.sleep(self.seconds)


class SignalAt(pl.Callback):
    """Send the signal ``name`` (e.g. SIGTERM) to this process when global step ``step`` starts: a scheduler
    preempting the job in the middle of a step, at a step the test knows."""

    def __init__(self, step: int, name: str) -> None:
        self.step, self.signum = step, getattr(signal, name)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module, batch, batch_idx: int) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)


class RefuseAtStep(pl.Callback):
    """At global step ``step`` raise the refusal a bad file met in training raises (a DataError naming it):
    a run refused after it claimed its run dir, before (step 0) or after it trained."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module, batch, batch_idx: int) -> None:
        if trainer.global_step == self.step:
            raise DataError(
                "image planted/bad.png cannot be decoded (planted by the test)", "planted/bad.png"
            )
