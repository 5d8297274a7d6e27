"""What a refused pickle would have run, named for the user.

Every weights file is read with ``torch.load(..., weights_only=True)``, which refuses a pickle that imports
or calls anything beyond tensors and plain data. torch's own message then suggests ``weights_only=False``;
segattn's message says instead that the file asks to run code, names the callables it would import
(read statically from the pickle, nothing is run), and asks for weights in a form that holds no code.
"""

from __future__ import annotations

import pickle
from pathlib import Path

from torch.serialization import get_unsafe_globals_in_checkpoint

ZIP_MAGIC = b"PK\x03\x04"  # torch.save writes zip archives
PICKLE_MAGIC = b"\x80"  # a pickle of protocol 2 or later (torch.save's legacy format)


def callables_in(path: Path) -> list[str]:
    """``module.name`` of each global the pickle in ``path`` would import beyond torch's allow-list,
    found by disassembling it (empty when it cannot be read that way)."""
    try:
        return sorted(get_unsafe_globals_in_checkpoint(path))
    except (pickle.UnpicklingError, RuntimeError, ValueError, OSError, EOFError):
        return []


def refused_pickle(key: str, path: Path, error: Exception) -> ValueError:
    """The error for a pickle ``weights_only=True`` refused: it asks to run code, and what it would call."""
    names = callables_in(path)
    if names:
        shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        what = f"when unpickled it would import and may call {shown}"
    else:
        what = " ".join(line for line in str(error).splitlines() if "GLOBAL" in line or "global" in line)
        what = what or "it holds Python objects beyond tensors and plain data"
    return ValueError(
        f"{key}={path}: refused to unpickle (weights_only=True): the file asks to run code: {what}. "
        "segattn reads tensors and plain data only and never runs code from a file; ask for the weights "
        "as a .safetensors file or a plain state_dict of tensors"
    )


def not_a_weights_file(key: str, path: Path, head: bytes, size: int, expected: str) -> ValueError | None:
    """None when ``head`` starts a torch.save file (zip archive or legacy pickle); else the error."""
    if head.startswith((ZIP_MAGIC, PICKLE_MAGIC)):
        return None
    what = "an empty file" if size == 0 else f"a file of {size} bytes starting with {head!r}"
    return ValueError(f"{key}={path}: not a weights file: {what}; expected {expected}")
