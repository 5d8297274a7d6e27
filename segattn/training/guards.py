"""NonFiniteGuard: skip optimizer steps whose loss or gradients are NaN/Inf, stop when it persists.

A skipped step leaves the model as it was: gradients are dropped before the optimizer sees them (AdamW
leaves weights and moments of parameters without a gradient untouched) and the buffers that the
forward pass updated (BatchNorm running statistics) are restored. The LR schedule still advances.
Under DDP every rank takes the same decision. With fp16's GradScaler, non-finite gradients are the
scaler's business (it skips those steps and lowers its scale); only the loss is checked then.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_warn
from torch import Tensor


class NonFiniteError(RuntimeError):
    """Training stopped because losses or gradients stayed non-finite."""


def gather(obj: Any) -> list[Any]:
    """``obj`` from every rank (a list of one without torch.distributed); all ranks must call it."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return [obj]
    gathered: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, obj)
    return gathered


def all_finite(tensors: list[Tensor]) -> bool:
    """Whether every element of ``tensors`` is finite (one device sync for all of them)."""
    if not tensors:
        return True
    return bool(torch.stack([torch.isfinite(tensor).all() for tensor in tensors]).all())


class NonFiniteGuard(pl.Callback):
    """Skip steps with a NaN/Inf loss or gradient (warned and logged as ``train/nonfinite_skips``); raise
    NonFiniteError after ``max_consecutive`` skipped steps in a row or ``max_total`` in the run, naming
    the step, the batch files and the last checkpoint written."""

    def __init__(self, max_consecutive: int = 3, max_total: int = 20) -> None:
        if max_consecutive < 1 or max_total < 1:
            raise ValueError(
                f"nonfinite_guard: max_consecutive={max_consecutive} and max_total={max_total} must be >= 1"
            )
        self.max_consecutive = max_consecutive
        self.max_total = max_total
        self.consecutive = 0
        self.total = 0
        self.paths: list[str] = []  # files of the micro-batches feeding the coming optimizer step
        self.losses: list[Tensor] = []
        self.saved_buffers: list[Tensor] = []

    def state_dict(self) -> dict[str, int]:
        return {"consecutive": self.consecutive, "total": self.total}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.consecutive, self.total = int(state_dict["consecutive"]), int(state_dict["total"])

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if not self.losses:  # first micro-batch of this optimizer step: remember the buffers
            with torch.no_grad():
                buffers = list(pl_module.buffers())
                if [b.shape for b in buffers] != [b.shape for b in self.saved_buffers]:
                    self.saved_buffers = [buffer.clone() for buffer in buffers]
                for saved, buffer in zip(self.saved_buffers, buffers, strict=True):
                    saved.copy_(buffer)
        self.paths += [str(path) for path in batch.get("path", [])] if isinstance(batch, dict) else []

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Tensor) -> None:
        self.losses.append(loss.detach())

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        scaler_owns_grads = getattr(trainer.precision_plugin, "scaler", None) is not None
        checked = self.losses + ([] if scaler_owns_grads else [p.grad.detach() for p in params])
        bad = trainer.strategy.reduce_boolean_decision(not all_finite(checked), all=False)
        paths, loss_finite = self.paths, all_finite(self.losses) if bad else True
        self.paths, self.losses = [], []
        if not bad:
            self.consecutive = 0
            return
        for param in params:
            param.grad = None
        with torch.no_grad():
            for buffer, saved in zip(pl_module.buffers(), self.saved_buffers, strict=True):
                buffer.copy_(saved)
        self.consecutive += 1
        self.total += 1
        pl_module.log("train/nonfinite_skips", float(self.total), on_step=True, on_epoch=False)
        self.report(trainer, paths, loss_finite)

    def report(self, trainer: pl.Trainer, paths: list[str], loss_finite: bool) -> None:
        """Warn about a skipped step, or raise NonFiniteError at the limits, naming the files of the ranks
        whose loss was non-finite (all ranks' when only the gradients, which DDP averages, were)."""
        reports = gather((loss_finite, paths))
        culprits = [rank_paths for finite, rank_paths in reports if not finite]
        files = [path for rank_paths in (culprits or [p for _, p in reports]) for path in rank_paths]
        where = (
            f"non-finite {'loss' if culprits else 'gradients'} at step {trainer.global_step} "
            f"(epoch {trainer.current_epoch}); batch files: {', '.join(files[:8]) or 'unknown'}"
            f"{', ...' if len(files) > 8 else ''}"
        )
        if self.consecutive >= self.max_consecutive or self.total >= self.max_total:
            raise NonFiniteError(
                f"{where}. Stopping: {self.consecutive} non-finite step(s) in a row "
                f"(max_consecutive={self.max_consecutive}), {self.total} in this run "
                f"(max_total={self.max_total}). Last good checkpoint: {last_checkpoint(trainer)}. "
                "Check these files with the data doctor, lower optimizer.lr or use "
                "trainer.precision=bf16-mixed, then resume with ckpt_path=<that checkpoint>."
            )
        rank_zero_warn(
            f"{where}: skipped this optimizer step ({self.consecutive} in a row, {self.total} in all; "
            f"stopping at {self.max_consecutive} in a row or {self.max_total} in all)"
        )


def last_checkpoint(trainer: pl.Trainer) -> str:
    """The newest checkpoint this run wrote (or resumed from); skipped steps never reach its weights."""
    callback = trainer.checkpoint_callback
    written = getattr(callback, "last_model_path", "") or getattr(callback, "best_model_path", "")
    return written or str(trainer.ckpt_path or "none written yet")
