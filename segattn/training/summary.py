"""The end-of-run summary: what train.py returns and prints on one screen."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from rich.columns import Columns
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table

from .callbacks import wandb_logger


def summarize(trainer: pl.Trainer, module: pl.LightningModule, run_dir: Path) -> dict[str, Any]:
    """The run's summary: run dir, best / last checkpoints, W&B run dir and final validation scores (percent).
    ``best_score`` is the best ``monitor`` value (the checkpoint callback's; ``val/mIoU`` by default),
    ``best_mIoU`` the same when that is monitored, ``best_step`` the optimizer step it was scored at."""
    checkpoint = trainer.checkpoint_callback
    best_score = getattr(checkpoint, "best_model_score", None)
    best_score = None if best_score is None else float(best_score)
    monitor = getattr(checkpoint, "monitor", None)
    logger = wandb_logger(trainer)
    wandb_dir = (
        str(Path(logger.experiment.dir).parent) if logger is not None and trainer.is_global_zero else None
    )
    return {
        "run_dir": str(run_dir),
        "epochs": trainer.current_epoch,
        "steps": trainer.global_step,
        "monitor": monitor,
        "best_score": best_score,
        "best_mIoU": best_score if monitor == "val/mIoU" else None,
        "best_step": getattr(checkpoint, "best_step", None),
        "best_checkpoint": getattr(checkpoint, "best_model_path", "") or None,
        "last_checkpoint": getattr(checkpoint, "last_model_path", "") or None,
        "wandb_dir": wandb_dir,
        "final": dict(module.val_scores),
    }


def print_summary(summary: dict[str, Any], console: Console | None = None) -> None:
    """A rich panel: where things are, the best and final scores, and the final IoU of every class."""
    table = Table.grid(padding=(0, 2))
    table.add_column(no_wrap=True)
    table.add_column(overflow="fold")  # long paths wrap instead of being cut
    final = summary["final"]
    rows = [
        (
            f"best {summary.get('monitor') or 'val/mIoU'}",
            _percent(summary.get("best_score")) + _at_step(summary),
        ),
        (
            "final mIoU / mAcc / aAcc",
            " / ".join(_percent(final.get(key)) for key in ("mIoU", "mAcc", "aAcc")),
        ),
        *_test_rows(summary),
        ("epochs / steps", f"{summary['epochs']} / {summary['steps']}"),
        ("run dir", summary["run_dir"]),
        ("best checkpoint", summary["best_checkpoint"] or "none: the run saved no checkpoint"),
        ("last checkpoint", summary["last_checkpoint"] or "-"),
        ("W&B run dir", summary["wandb_dir"] or "-"),
    ]
    for key, value in rows:
        table.add_row(f"[bold]{key}[/]", value)
    test = summary.get("test") or {}
    which, per_class_iou = ("test", test["IoU"]) if test.get("IoU") else ("final", final.get("IoU"))
    per_class = Columns(
        [f"{name}: {_percent(iou)}" for name, iou in (per_class_iou or {}).items()], padding=(0, 3)
    )
    body = Group(table, "", f"[bold]{which} IoU per class[/]", per_class) if per_class_iou else table
    (console or Console()).print(Panel(body, title="segattn run summary", expand=False))


def _test_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The test scores beside val, or why there are none (no ``test_note``: testing was turned off)."""
    if "test_note" not in summary:
        return []
    test = summary.get("test") or {}
    scores = " / ".join(_percent(test.get(key)) for key in ("mIoU", "mAcc", "aAcc")) if test else "-"
    return [("test mIoU / mAcc / aAcc", scores), ("test set", summary["test_note"])]


def _at_step(summary: dict[str, Any]) -> str:
    return "" if summary.get("best_step") is None else f" at step {summary['best_step']}"


def _percent(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.2f}"
