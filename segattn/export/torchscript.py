"""model.pt: the model traced to TorchScript, with the model's record in its extra file ``segattn.json``;
checked as eval and predict run it (``open_model``)."""

from __future__ import annotations

import io
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..files import atomic_write
from ..inference.trained import open_model
from ..record import RECORD_FILE, TORCHSCRIPT_FILE, ModelRecord
from .verify import ExportError, check_sizes, compare, run_opened, trace_size
from .wrapper import ExportWrapper


def export_torchscript(
    model: nn.Module, record: ModelRecord, out: Path, size: tuple[int, int], atol: float
) -> dict[str, Any]:
    """model.pt traced at ``size`` (the record in its extra file), checked on two sizes."""
    name = record.attention
    label = f"torchscript[{name}]"
    out.mkdir(parents=True, exist_ok=True)
    wrapper = ExportWrapper(model).eval()
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            traced = torch.jit.trace(wrapper, torch.randn(1, 3, *trace_size(*size)), check_trace=False)
    except Exception as error:
        raise ExportError(f"attention {name!r} cannot be traced to TorchScript: {error}") from None
    path = out / TORCHSCRIPT_FILE
    with warnings.catch_warnings():
        # torch.jit is marked deprecated in favour of torch.export; it still saves and loads fine.
        warnings.simplefilter("ignore", FutureWarning)
        # Serialised in memory, then written by Python: torch.jit.save's own C++ writer aborts the process
        # on a full disk (status 134) and leaves its partial file.
        buffer = io.BytesIO()
        torch.jit.save(traced, buffer, _extra_files={RECORD_FILE: record.to_json()})
        atomic_write(path, lambda handle: handle.write(buffer.getbuffer()))
    results = compare(wrapper, run_opened(open_model(path, device="cpu")), check_sizes(*size), atol, label)
    return {"format": "torchscript", "attention": name, "checks": results}
