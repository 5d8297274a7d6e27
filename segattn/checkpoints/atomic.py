"""Crash-safe checkpoint files: ``torch.save`` through ``segattn.files.atomic_write`` (a kill at any moment
leaves the previous checkpoint or the new one, never a partial file under the checkpoint's name), and
Lightning's checkpoint IO doing the same for the trainer's own checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from pytorch_lightning.plugins.io import TorchCheckpointIO

from ..files import atomic_write


def atomic_save(obj: Any, path: str | Path) -> None:
    """``torch.save(obj)`` to ``path``, crash-safe (``files.atomic_write``)."""
    atomic_write(path, lambda handle: torch.save(obj, handle))


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
