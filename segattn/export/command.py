"""Export a trained model to ONNX, TorchScript or safetensors, and prove each export right after writing it.

    python -m segattn.export checkpoint=<ckpt|exported dir> format=onnx|torchscript|safetensors out=<dir>

Every export is checked against PyTorch on two input sizes (the second non-square, batch 2): the command
prints the max abs difference and fails above ``atol``. The model's record (``segattn.record.ModelRecord``:
config, classes, palette, normalisation, inference settings, versions) travels once in every format, as
the same JSON document: ``segattn.json`` beside the safetensors weights, inside ``model.onnx``
(metadata_props) and ``model.pt`` (extra file ``segattn.json``).
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from rich.console import Console
from torch import nn

from ..cli import run_command
from ..inference.trained import open_model
from ..record import ModelRecord
from .onnx import export_onnx
from .safetensors import export_safetensors
from .torchscript import export_torchscript
from .verify import ExportError

FORMATS = ("onnx", "torchscript", "safetensors")
EXPORTERS = ("auto", "dynamo", "torchscript")


def export(
    model: nn.Module,
    record: ModelRecord,
    fmt: str,
    out: str | Path,
    size: tuple[int, int] = (512, 512),
    opset: int = 18,
    atol: float = 1e-4,
    exporter: str = "auto",
) -> dict[str, Any]:
    """Export ``model`` (the network ``open_model`` rebuilt, ``record`` what it is) to ``out`` in format
    ``fmt``; a report dict."""
    if fmt not in FORMATS:
        raise ExportError(f"format={fmt!r}; expected one of {FORMATS}")
    if exporter not in EXPORTERS:
        raise ExportError(f"exporter={exporter!r}; expected one of {EXPORTERS}")
    model = model.eval()
    out = Path(out)
    if fmt == "onnx":
        return export_onnx(model, record, out, size, opset, atol, exporter)
    if fmt == "torchscript":
        return export_torchscript(model, record, out, size, atol)
    return export_safetensors(model, record, out, size)


def main(argv: list[str] | None = None) -> int:
    """``python -m segattn.export`` / ``segattn-export``: compose conf/export.yaml with ``argv``."""
    return run_command("segattn.export", "export", run, argv)


def run(args: DictConfig) -> int:
    """Export and verify; 1 (one line on stderr) when the model cannot be loaded, exported or matched."""
    if args.threads:
        torch.set_num_threads(args.threads)  # PyTorch and onnxruntime (latency report) alike
    try:
        opened = open_model(args.checkpoint, device="cpu")  # export and its check run on the CPU
        if opened.format in ("onnx", "torchscript"):
            path = args.checkpoint
            raise ValueError(
                f"{path}: a model exported to {opened.format} runs as it is (python -m segattn.predict "
                f"checkpoint={path}); export from the checkpoint it came from"
            )
        start = time.perf_counter()
        doing = f"exporting {args.checkpoint} as {args.format} to {args.out} at {args.height}x{args.width}"
        print(f"{doing}, then checking it against PyTorch (a minute or more on a CPU)", flush=True)
        with working(doing):
            report = export(
                opened.network,
                opened.record,
                args.format,
                args.out,
                (args.height, args.width),
                args.opset,
                args.atol,
                args.exporter,
            )
    except (ExportError, ValueError, FileNotFoundError) as error:
        print(f"segattn.export: {error}", file=sys.stderr)
        return 1
    print(f"exported {report['format']} to {args.out} in {time.perf_counter() - start:.1f} s")
    return 0


def working(what: str) -> contextlib.AbstractContextManager:
    """A Rich spinner saying ``what`` while the block runs, on a terminal; nothing where stdout is a file."""
    return Console().status(what) if sys.stdout.isatty() else contextlib.nullcontext()
