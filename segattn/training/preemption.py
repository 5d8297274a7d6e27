"""Preemption: a run stopped by a scheduler's signal ends after the current step with a step-exact last.ckpt.

The signal a scheduler sends before it kills a job (SIGTERM; SIGUSR1 from SLURM's ``--signal=USR1@<seconds>``)
saves ``last.ckpt`` (atomic writer) after the current training step and exits with 128 + signal number, as
that signal would. ``ckpt_path=auto`` (or ``last``) with the same run directory continues at the next step:
Lightning restores the loop counters and ``ResumableDataLoader`` replays the epoch's batches.

Under SLURM, SIGUSR1 also requeues the job (``scontrol requeue``) as Lightning's auto-requeue does;
Lightning's handler is replaced because it saves inside the signal handler, possibly mid optimizer step.
Ctrl-C (SIGINT) is handled the same way; a second Ctrl-C before the step ends stops at once without saving
(KeyboardInterrupt, which Lightning shuts down on).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
from collections.abc import Sequence
from types import FrameType
from typing import Any

import pytorch_lightning as pl
from lightning_fabric.plugins.environments import SLURMEnvironment

from .checkpointing import ResumableModelCheckpoint

log = logging.getLogger(__name__)


class Preempted(SystemExit):
    """The run stopped on a scheduler's signal after saving; the exit status is 128 + signal number."""


def parse_signals(names: Sequence[str]) -> list[signal.Signals]:
    """``[SIGTERM, SIGUSR1]`` → signal numbers; an unknown name is an error naming the config key."""
    known = {sig.name: sig for sig in signal.Signals if sig not in (signal.SIGKILL, signal.SIGSTOP)}
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise ValueError(
            f"callbacks.preemption.signals={list(names)}: expected a non-empty list of catchable signal "
            "names such as SIGTERM, SIGUSR1, SIGUSR2"
        )
    return [known[name] for name in names]


def slurm_job_id() -> str | None:
    """The id ``scontrol requeue`` takes: ``<array job>_<task>`` for array jobs, else the job id."""
    if array_job := os.environ.get("SLURM_ARRAY_JOB_ID"):
        return f"{array_job}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ.get("SLURM_JOB_ID")


def requeue_slurm_job() -> None:
    """Put this SLURM job back in the queue; it restarts with the same command (ckpt_path=auto resumes)."""
    job_id = slurm_job_id()
    if job_id is None:
        log.warning("SLURM requeue skipped: no SLURM_JOB_ID in the environment")
        return
    result = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True)
    if result.returncode == 0:
        log.info(f"requeued SLURM job {job_id}")
    else:
        log.warning(f"scontrol requeue {job_id} failed ({result.returncode}): {result.stderr.strip()}")


class PreemptionCheckpoint(pl.Callback):
    """The callback that stops, saves and (SLURM + SIGUSR1 with ``requeue``) requeues on any of ``signals``.

    Under DDP all ranks stop at the same step: the flag is all-reduced after every step, and rank zero
    forwards the signal to processes Lightning launched itself.
    """

    def __init__(self, signals: Sequence[str] = ("SIGTERM", "SIGUSR1"), requeue: bool = True) -> None:
        if not isinstance(requeue, bool):
            raise ValueError(f"callbacks.preemption.requeue={requeue!r}; expected true or false")
        self.signals = parse_signals(signals)
        self.requeue = requeue
        self.received: signal.Signals | None = None
        self.previous: dict[signal.Signals, Any] = {}
        self.trainer: pl.Trainer | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Install the handlers after Lightning installed its own (they would stop mid-validation)."""
        if threading.current_thread() is not threading.main_thread():
            return
        self.trainer = trainer
        self.previous = {signum: signal.signal(signum, self.handle) for signum in self.signals}

    def handle(self, signum: int, frame: FrameType | None) -> None:
        """Signal handler: note the request, so the step in progress finishes first; a second Ctrl-C
        raises KeyboardInterrupt."""
        if signum == signal.SIGINT and self.received == signal.SIGINT:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        if self.received is None:
            again = " (Ctrl-C again to stop at once, without saving)" if signum == signal.SIGINT else ""
            log.info(f"received {signal.Signals(signum).name}: stopping after this training step{again}")
            launcher = self.trainer.strategy.launcher if self.trainer is not None else None
            # ranks this process started itself get the signal too; a terminal's Ctrl-C reaches them already
            if launcher is not None and self.trainer.is_global_zero and signum != signal.SIGINT:
                launcher.kill(signum)
        self.received = signal.Signals(signum)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not trainer.strategy.reduce_boolean_decision(self.received is not None, all=False):
            return
        signum = self.received or signal.SIGTERM  # a rank that did not get the signal itself
        checkpoint = trainer.checkpoint_callback
        if isinstance(checkpoint, ResumableModelCheckpoint):
            saved = checkpoint.save_last_now(trainer)
            where = f"saved {saved} at step {trainer.global_step}; resume with ckpt_path=auto (same run dir)"
        else:
            where = "no checkpoint saved (callbacks.model_checkpoint is off)"
        if trainer.is_global_zero:
            how = (
                f"preempted by {signum.name}" if signum != signal.SIGINT else "interrupted by SIGINT (Ctrl-C)"
            )
            log.warning(f"{how} at epoch {trainer.current_epoch}: {where}")
            if self.requeue and signum == signal.SIGUSR1 and SLURMEnvironment.detect():
                requeue_slurm_job()
        raise Preempted(128 + signum)

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self.restore()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.restore()

    def restore(self) -> None:
        """Put back the handlers that were installed before training."""
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        self.previous = {}
