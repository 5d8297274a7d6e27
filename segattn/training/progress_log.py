"""Plain progress lines through Python logging, for runs watched through a log file (nohup, a scheduler):
one line every ``trainer.log_every_n_steps`` steps and one per validation. Hydra's logging config sends
them to the run dir's ``train.log`` and, unless a progress bar shows the steps (on a terminal), to stdout.
The bar and the lines both count epochs from 1.

    epoch 2/20 step 120/480 loss 0.8123 lr 3.20e-04 55.1 img/s ETA 0:03:12
    epoch 2/20 step 128/480 val mIoU 31.20 mAcc 40.10 aAcc 80.00 mAP 35.40 (validation 2.1 s)
"""

from __future__ import annotations

import datetime
import logging
import math
import time
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import RichProgressBar

from .runlog import to_files

log = logging.getLogger("segattn.train")


class ProgressLog(pl.Callback):
    """Logs training progress on rank zero: mean loss since the previous line, the scheduled LR,
    throughput (images/s since the previous line), ETA from the mean step time of this run, and the
    validation scores. Losses are summed on the device and read once per line (no sync per step)."""

    def __init__(self) -> None:
        self.reset_window()
        self.fit_started = self.val_started = 0.0
        self.first_step = 0

    def reset_window(self) -> None:
        self.window_started = time.monotonic()
        self.window_images = 0
        self.window_steps = 0
        self.loss_sum: torch.Tensor | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.fit_started, self.first_step = time.monotonic(), trainer.global_step  # resumed runs too
        self.reset_window()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is not None:
            self.loss_sum = loss.detach() if self.loss_sum is None else self.loss_sum + loss.detach()
        self.window_steps += 1
        self.window_images += len(batch["image"]) * trainer.world_size
        if trainer.is_global_zero and trainer.global_step % max(1, trainer.log_every_n_steps) == 0:
            if trainer.progress_bar_callback is None:
                log.info(self.step_line(trainer))
            else:  # the bar shows the steps on the terminal: the line goes to the log files only
                to_files(log, self.step_line(trainer))
            self.reset_window()

    def step_line(self, trainer: pl.Trainer) -> str:
        now = time.monotonic()
        loss = "-" if self.loss_sum is None else f"{self.loss_sum.item() / max(1, self.window_steps):.4f}"
        lr = trainer.callback_metrics.get("train/lr")
        rate = self.window_images / max(now - self.window_started, 1e-9)
        total = trainer.estimated_stepping_batches
        done = trainer.global_step - self.first_step
        eta = "-"
        if done > 0 and math.isfinite(total):
            seconds = (now - self.fit_started) / done * (total - trainer.global_step)
            eta = str(datetime.timedelta(seconds=round(seconds)))
        return (
            f"{self.position(trainer)}/{total if math.isfinite(total) else '?'} loss {loss} "
            f"lr {'-' if lr is None else f'{float(lr):.2e}'} {rate:.1f} img/s ETA {eta}"
        )

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.val_started = time.monotonic()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        metrics = trainer.callback_metrics
        scores = " ".join(
            f"{name} {float(metrics[f'val/{name}']):.2f}"
            for name in ("mIoU", "mAcc", "aAcc", "mAP")
            if f"val/{name}" in metrics
        )
        seconds = time.monotonic() - self.val_started
        log.info(f"{self.position(trainer)} val {scores or '-'} (validation {seconds:.1f} s)")

    @staticmethod
    def position(trainer: pl.Trainer) -> str:
        """``epoch E/N step S`` with 1-based epochs."""
        return f"epoch {epoch_count(trainer)} step {trainer.global_step}"


def epoch_count(trainer: pl.Trainer) -> str:
    """``E/N``: the epoch being trained counted from 1, of ``trainer.max_epochs`` (``?`` when unlimited)."""
    epochs = trainer.max_epochs if trainer.max_epochs not in (None, -1) else "?"
    return f"{trainer.current_epoch + 1}/{epochs}"


class EpochsFromOneBar(RichProgressBar):
    """Lightning's Rich progress bar, its epochs counted from 1 as the log lines count them (``Epoch 1/20``
    where Lightning shows ``Epoch 0/19``)."""

    def _get_train_description(self, current_epoch: int) -> str:
        description = f"Epoch {epoch_count(self.trainer)}"
        return f"{description:{len(self.validation_description)}}"  # as wide as "Validation": no flicker
