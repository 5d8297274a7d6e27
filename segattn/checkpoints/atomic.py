"""Crash-safe checkpoint files: ``torch.save`` through ``segattn.files.atomic_write``, so a kill at any moment
leaves the previous checkpoint or the new one, never a partial file under the checkpoint's name (Lightning's
own checkpoints go through it too: ``training.checkpointing.AtomicCheckpointIO``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..files import atomic_write


def atomic_save(obj: Any, path: str | Path) -> None:
    """``torch.save(obj)`` to ``path``, crash-safe (``files.atomic_write``)."""
    atomic_write(path, lambda handle: torch.save(obj, handle))
