"""The one error type of every refusal a user can act on, and ``translate`` for known third-party failures.

Each command maps them once, at its entry (``segattn.cli``, which the bench uses too), to one line on stderr
and an exit status; ``HYDRA_FULL_ERROR=1`` shows the traceback instead.

Exit statuses (docs/troubleshooting.md):

- 0: done, or nothing to do.
- 1: refused or failed: a file, the data, the disk, a run. train.py and eval.py, Hydra applications, exit
  with 1 for every refusal, also of their configuration.
- 2: the command line or the configuration was refused before anything ran (export, predict, the doctor,
  the bench).

Standard library only, the lowest layer: every package may raise these, and the third-party errors are
recognised by their class names, without importing their libraries (predict with an ONNX model runs
without torch).
"""

from __future__ import annotations

import errno
from pathlib import Path

EXIT_FAILED = 1
EXIT_CONFIG = 2
EXIT_INTERRUPTED = 130  # Ctrl-C, as the shell reports a process SIGINT ended (128 + 2)


class SegattnError(Exception):
    """A refusal the user can act on: the message names the file, key or value, what was expected and,
    where it can, what to do. ``status``: the exit status of the commands that tell it apart."""

    status = EXIT_FAILED


class ConfigError(SegattnError, ValueError):
    """A key or value of the command line, the config or the environment (SEGATTN_KERNEL)."""

    status = EXIT_CONFIG


class FileFormatError(SegattnError, ValueError):
    """A file that is not what the key naming it expects: a truncated safetensors file, a text file named
    ``.onnx``, ONNX metadata that is not JSON."""

    def __init__(self, message: str, path: str | Path | None = None):
        super().__init__(message)
        self.path = None if path is None else str(path)


class DiskError(SegattnError, OSError):
    """A write the file system refused: no space left, a read-only or not writable folder."""


FULL = (errno.ENOSPC, errno.EDQUOT)
DENIED = {
    errno.EROFS: "is on a read-only file system",
    errno.EACCES: "is not writable by this user",
    errno.EPERM: "is not writable by this user",
}

# Third-party failures by the qualified names of their classes: what they say about the file (None: their
# own message says it, as Hydra's and OmegaConf's name the key), and the kind they become.
KNOWN: dict[str, tuple[str | None, type[SegattnError]]] = {
    "safetensors._safetensors_rust.SafetensorError": ("not a readable safetensors file", FileFormatError),
    "google.protobuf.message.DecodeError": ("not a readable ONNX model", FileFormatError),
    "onnx.onnx_cpp2py_export.checker.ValidationError": ("not a valid ONNX model", FileFormatError),
    "onnxruntime.capi.onnxruntime_pybind11_state.InvalidProtobuf": (
        "not a readable ONNX model",
        FileFormatError,
    ),
    "onnxruntime.capi.onnxruntime_pybind11_state.InvalidGraph": ("not a valid ONNX model", FileFormatError),
    "json.decoder.JSONDecodeError": ("not valid JSON", FileFormatError),
    "yaml.error.YAMLError": ("not valid YAML", FileFormatError),
    "hydra.errors.HydraException": (None, ConfigError),
    "omegaconf.errors.OmegaConfBaseException": (None, ConfigError),
    "lightning_fabric.utilities.exceptions.MisconfigurationException": (
        "Lightning refused the trainer settings",
        ConfigError,
    ),
    "mlflow.exceptions.MlflowException": ("MLflow refused logger.mlflow", ConfigError),
}


def one_line(error: BaseException | str) -> str:
    """A message spread over several lines (Hydra, onnxruntime, Lightning) on one."""
    return " ".join(line.strip() for line in str(error).splitlines() if line.strip())


def os_error(error: BaseException) -> OSError | None:
    """The OSError of a full disk or a refused write in ``error``'s chain (cause or context): torch.save
    reports a failed write as "RuntimeError: [enforce fail at inline_container.cc] unexpected pos", with the
    OSError as its context."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, SegattnError):  # said already
            return None
        if isinstance(current, OSError) and (current.errno in FULL or current.errno in DENIED):
            return current
        current = current.__cause__ or current.__context__
    return None


def disk_error(cause: OSError, path: str | Path | None = None, what: str | None = None) -> DiskError:
    """``cause`` (ENOSPC, EDQUOT, EROFS, EACCES, EPERM) as one line naming the folder and what was being
    written: "no space left on <folder>: writing <file>"."""
    path = path or cause.filename
    folder = Path(path).parent if path else "the device"
    what = what or (f"writing {Path(path).name}" if path else "writing a file")
    if cause.errno in FULL:
        error = DiskError(f"no space left on {folder}: {what}; free some space or write elsewhere")
    else:
        error = DiskError(
            f"{folder} {DENIED[cause.errno]}: {what}; write elsewhere or change its permissions"
        )
    error.__cause__ = cause
    return error


def qualified_names(error: BaseException) -> list[str]:
    return [f"{cls.__module__}.{cls.__qualname__}" for cls in type(error).__mro__]


def translate(error: BaseException) -> SegattnError | None:
    """``error`` as the project error a user can act on, or None when it is not one (a bug: its traceback
    is shown). A full disk or a refused write anywhere in its chain is a ``DiskError``; a known third-party
    failure (``KNOWN``) keeps its message, with the file it names where the library gives one."""
    if isinstance(error, SegattnError):
        return error
    cause = os_error(error)
    if cause is not None:
        return disk_error(cause)
    for name in qualified_names(error):
        if name in KNOWN:
            what, kind = KNOWN[name]
            filename = getattr(error, "filename", None) or getattr(error, "path", None)
            prefix = "".join(f"{part}: " for part in (filename, what) if part)
            text = one_line(error).split(" Config search path:")[0]  # Hydra's list of where it looked
            translated = kind(f"{prefix}{text}")
            translated.__cause__ = error
            return translated
    return None


__all__ = [
    "EXIT_CONFIG",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "ConfigError",
    "DiskError",
    "FileFormatError",
    "SegattnError",
    "disk_error",
    "translate",
]
