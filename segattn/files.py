"""Crash-safe file writes for every writer of the package: a kill at any moment leaves the previous file or
the new one under its name, never a partial file.

A file is written to a hidden temporary file in the same folder (``.<name>.<pid>.<random>.tmp``), flushed
and fsync'ed, renamed over the target with ``os.replace`` (atomic within one file system), and the folder
is fsync'ed so that the rename itself survives a power loss. A write the file system refuses (no space
left, a read-only or not writable folder) is a ``DiskError`` naming the folder and the file, and leaves no
temporary file. Also where ``conf/`` is (``config_dir``) and a yaml file's values (``conf_values``, read with
OmegaConf; all else is standard library). Imported by data, inference, checkpoints, evaluation, export and
training alike.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from .errors import disk_error, os_error


def source_checkout() -> Path | None:
    """The repository this package runs from (an editable install or a checkout), if any."""
    root = Path(__file__).resolve().parents[1]
    return root if (root / "pyproject.toml").is_file() and (root / "conf").is_dir() else None


def config_dir() -> Path:
    """``conf/``: the checkout's top-level folder, or the copy a non-editable install ships in the package."""
    checkout = source_checkout()
    return checkout / "conf" if checkout else Path(__file__).resolve().parent / "conf"


def conf_values(name: str) -> dict[str, Any]:
    """``conf/<name>.yaml``'s values as plain Python: the defaults a constructor takes, declared once."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(config_dir() / f"{name}.yaml"))


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


def fsync_replace(source: Path, target: Path) -> None:
    """Rename the finished file ``source`` over ``target`` after flushing it to disk, then persist the
    rename: ``target`` is old or new, never half."""
    with open(source, "rb") as file:
        os.fsync(file.fileno())
    os.replace(source, target)
    fsync_dir(target.parent)


@contextlib.contextmanager
def replacing(path: str | Path, sole_writer: bool = True) -> Iterator[Path]:
    """A temporary path next to ``path`` for a writer that takes a file name (``onnx.save``,
    ``torch.jit.save``, safetensors): renamed over ``path`` when the block succeeds (``fsync_replace``),
    removed when it fails. ``sole_writer``: nobody else writes ``path`` now, so the temporary files of
    killed earlier writers are removed first; False where several processes may fill the same file with
    the same content at once (a shared cache), each through its own temporary file."""
    path = Path(path)
    temp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for stale in temp_files(path) if sole_writer else []:
            stale.unlink(missing_ok=True)
        yield temp
        fsync_replace(temp, path)
    except BaseException as error:
        with contextlib.suppress(OSError):
            temp.unlink(missing_ok=True)
        cause = os_error(error)
        if cause is not None:  # a full disk reads as "unexpected pos" from torch.save: say what it was
            raise disk_error(cause, path) from error
        raise


def atomic_write(path: str | Path, write: Callable[[BinaryIO], object], sole_writer: bool = True) -> None:
    """``write(handle)`` into ``path`` through a fsync'ed temporary file and an atomic rename
    (``sole_writer`` as in ``replacing``)."""
    with replacing(path, sole_writer) as temp:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # 0o666 & ~umask, like open()
        with os.fdopen(fd, "wb") as handle:
            write(handle)


def atomic_write_text(path: str | Path, text: str) -> None:
    """``text`` (UTF-8) into ``path``, crash-safe (``atomic_write``)."""
    atomic_write(path, lambda handle: handle.write(text.encode("utf-8")))


def write_json(path: str | Path, payload: Any) -> None:
    """``payload`` as standard JSON into ``path`` (indented, crash-safe): a NaN or infinite number, which
    strict JSON parsers reject, is written as null."""
    atomic_write_text(path, json.dumps(finite_numbers(payload), indent=2, allow_nan=False) + "\n")


def finite_numbers(value: Any) -> Any:
    """``value`` with every NaN or infinite float in its dicts, lists and tuples replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_numbers(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite_numbers(item) for item in value]
    return value
