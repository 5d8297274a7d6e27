"""model.safetensors with segattn.json, the record: the weights for segattn's own loader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from ..checkpoints.loading import save_exported
from ..inference.trained import open_model
from ..record import WEIGHTS_FILE, ModelRecord
from .verify import check_sizes, compare, run_opened
from .wrapper import ExportWrapper


def export_safetensors(
    model: nn.Module, record: ModelRecord, out: Path, size: tuple[int, int]
) -> dict[str, Any]:
    """model.safetensors + segattn.json, reopened by ``open_model`` as eval and predict open
    it; must match exactly."""
    name = record.attention
    save_exported(model, record, out)
    reopened = run_opened(open_model(out, device="cpu"))
    results = compare(ExportWrapper(model).eval(), reopened, check_sizes(*size), 0.0, f"safetensors[{name}]")
    return {"format": "safetensors", "attention": name, "file": str(out / WEIGHTS_FILE), "checks": results}
