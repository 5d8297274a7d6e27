"""model.onnx: torch's dynamo exporter with a fallback to the TorchScript-based one, the model's record
embedded in the file (the one place an ONNX export carries it), and the exporters' console output silenced;
checked in onnxruntime."""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..attention import attention_class
from ..files import replacing
from ..inference.onnx import ONNX_FILE
from ..inference.trained import open_model
from ..record import RECORD_KEY, ModelRecord
from .verify import ExportError, check_sizes, compare, latency, run_opened, trace_size
from .wrapper import ExportWrapper


def first_line(error: BaseException) -> str:
    """A one-line reason for an exporter failure: the first sentence of the outermost and of the root error.

    Exporters raise pages of colourised, traceback-like text; the root cause is what users can act on.
    """
    root = error
    while root.__cause__ is not None:
        root = root.__cause__
    lines = []
    for item in (error, root) if root is not error else (error,):
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(item)).strip()
        lines.append(text.splitlines()[0].split(". ")[0] if text else type(item).__name__)
    return ": ".join(lines)


@contextlib.contextmanager
def silenced_output() -> Iterator[None]:
    """Send stdout/stderr, Python's and C++'s (file descriptors 1, 2), to a throwaway file.

    The exporters print progress and, on failure, whole TorchScript graphs; the exception keeps the reason.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with tempfile.TemporaryFile() as sink, contextlib.redirect_stdout(io.StringIO()):
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, copy in zip((1, 2), saved, strict=True):
            os.dup2(copy, fd)
            os.close(copy)


def torch_onnx_export(
    wrapper: nn.Module, example: Tensor, path: Path, opset: int, exporter: str, dynamic: bool
) -> None:
    """One attempt with one exporter; batch is always symbolic, height and width when ``dynamic``."""
    options: dict[str, Any] = {"input_names": ["images"], "output_names": ["logits"], "opset_version": opset}
    if exporter == "dynamo":
        auto = torch.export.Dim.AUTO
        options |= {
            "dynamo": True,
            "dynamic_shapes": ({0: auto, 2: auto, 3: auto} if dynamic else {0: auto},),
            "external_data": False,  # one self-contained file: predict needs model.onnx alone
        }
    else:
        axes = {0: "batch", 2: "height", 3: "width"} if dynamic else {0: "batch"}
        options |= {"dynamo": False, "dynamic_axes": {"images": axes, "logits": axes}}
    with warnings.catch_warnings(), silenced_output():
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapper, (example,), str(path), verbose=False, **options)


def onnx_attempt(
    wrapper: nn.Module, record: ModelRecord, path: Path, opset: int, exporter: str, shapes: list, atol: float
) -> tuple[Any, list[dict[str, Any]]]:
    """Export with one exporter, embed the metadata, check the file as predict opens it (``open_model``:
    onnxruntime); (its runner, check results)."""
    import onnx

    dynamic = attention_class(record.attention).onnx_dynamic
    label = f"onnx[{record.attention}, {exporter} exporter]"
    # Batch 2: torch.export specialises a dimension whose example size is 0 or 1. A dynamic graph is
    # traced at trace_size so that the TorchScript-based exporter records the general branches.
    example = torch.randn(2, 3, *(trace_size(*shapes[0][2:]) if dynamic else shapes[0][2:]))
    with replacing(path) as temp:  # model.onnx appears complete, metadata included, or not at all
        torch_onnx_export(wrapper, example, temp, opset, exporter, dynamic)
        proto = onnx.load(str(temp))
        proto.metadata_props.add(key=RECORD_KEY, value=record.to_json())
        onnx.save(proto, str(temp))
    # Opened as eval and predict open it, with torch's thread count: the latency compares like with like.
    opened = open_model(path, threads=torch.get_num_threads(), device="cpu")
    fixed = opened.session.fixed_size if opened.session is not None else None
    if dynamic and fixed is not None:  # the batch: checked at 1 and 2
        raise ExportError(
            f"{label}: graph input fixed at {fixed[0]}x{fixed[1]}; expected symbolic height, width"
        )
    run_ort = run_opened(opened)
    return run_ort, compare(wrapper, run_ort, shapes, atol, label)


def export_onnx(
    model: nn.Module,
    record: ModelRecord,
    out: Path,
    size: tuple[int, int],
    opset: int,
    atol: float,
    exporter: str,
) -> dict[str, Any]:
    """model.onnx with dynamic batch, H, W (fixed H, W for variants flagged ``onnx_dynamic = False``).

    ``exporter=auto`` tries torch's dynamo exporter first and the TorchScript-based one if that fails
    or does not reproduce PyTorch.
    """
    name = record.attention
    dynamic = attention_class(name).onnx_dynamic
    if opset < 17:
        raise ExportError(f"opset={opset}; segattn exports need opset >= 17 (LayerNorm as one op)")
    if not dynamic:
        print(
            f"onnx: attention {name!r} has onnx_dynamic=False: exporting a fixed {size[0]}x{size[1]} input "
            "(predict runs it in slide mode with that crop)"
        )
    out.mkdir(parents=True, exist_ok=True)
    path = out / ONNX_FILE
    wrapper = ExportWrapper(model).eval()
    shapes = check_sizes(*size) if dynamic else [(1, 3, *size), (2, 3, *size)]
    errors = []
    for attempt in ("dynamo", "torchscript") if exporter == "auto" else (exporter,):
        try:
            run_ort, results = onnx_attempt(wrapper, record, path, opset, attempt, shapes, atol)
            break
        except Exception as error:
            reason = first_line(error)
            errors.append(reason if isinstance(error, ExportError) else f"{attempt} exporter: {reason}")
            print(f"onnx[{name}]: {errors[-1]}", file=sys.stderr)
    else:
        path.unlink(missing_ok=True)
        raise ExportError(f"attention {name!r} cannot be exported to ONNX ({'; '.join(errors)})")
    images = torch.randn(1, 3, *size)
    with torch.inference_mode():
        timing = latency({"onnxruntime_ms": run_ort, "pytorch_ms": wrapper}, images)
    print(
        f"onnx[{name}]: CPU latency at 1x3x{size[0]}x{size[1]}: "
        f"onnxruntime {timing['onnxruntime_ms']:.1f} ms, PyTorch {timing['pytorch_ms']:.1f} ms "
        f"(median of 5, {torch.get_num_threads()} threads)"
    )
    return {
        "format": "onnx",
        "attention": name,
        "exporter": attempt,
        "dynamic": dynamic,
        "checks": results,
        "latency": timing,
    }
