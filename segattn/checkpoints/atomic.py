"""Crash-safe checkpoint files: a kill at any moment leaves the previous checkpoint or the new one, never
a partial file under the checkpoint's name.

The checkpoint is written to a hidden temporary file in the same folder (``.<name>.<pid>.<random>.tmp``),
flushed and fsync'ed, renamed over the target with ``os.replace`` (atomic within one file system), and the
folder is fsync'ed so the rename itself survives a power loss. One writer per checkpoint file.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import torch
from pytorch_lightning.plugins.io import TorchCheckpointIO


def temp_files(path: Path) -> list[Path]:
    """Temporary files left next to ``path`` by writers that were killed before their rename."""
    return sorted(path.parent.glob(f".{path.name}.*.tmp"))


def fsync_dir(folder: Path) -> None:
    """Persist a folder's entries (a completed rename) on file systems that support it."""
    with contextlib.suppress(OSError):  # e.g. EINVAL on file systems without directory fsync
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write(path: str | Path, write: Callable[[BinaryIO], object]) -> None:
    """``write(handle)`` into ``path`` through a fsync'ed temporary file and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in temp_files(path):  # partial writes of a killed earlier process
        stale.unlink(missing_ok=True)
    temp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # 0o666 & ~umask, like open()
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_save(obj: Any, path: str | Path) -> None:
    """``torch.save(obj)`` to ``path``, crash-safe (``atomic_write``)."""
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
