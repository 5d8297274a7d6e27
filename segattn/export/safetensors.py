"""model.safetensors with model.yaml and classes.json: the weights for segattn's own loader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from ..checkpoints.loading import load_exported, save_exported
from ..record import WEIGHTS_FILE, ModelRecord
from .verify import check_sizes, compare
from .wrapper import ExportWrapper


def export_safetensors(
    model: nn.Module, record: ModelRecord, out: Path, size: tuple[int, int]
) -> dict[str, Any]:
    """model.safetensors + model.yaml + classes.json, reloaded with load_exported; must match exactly."""
    name = record.attention
    save_exported(model, record, out)
    reloaded, _ = load_exported(out)
    results = compare(
        ExportWrapper(model).eval(),
        ExportWrapper(reloaded).eval(),
        check_sizes(*size),
        0.0,
        f"safetensors[{name}]",
    )
    return {"format": "safetensors", "attention": name, "file": str(out / WEIGHTS_FILE), "checks": results}
