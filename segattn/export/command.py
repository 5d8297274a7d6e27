"""Export a trained model to ONNX, TorchScript or safetensors, and prove each export right after writing it.

    python -m segattn.export checkpoint=<ckpt|exported dir> format=onnx|torchscript|safetensors out=<dir>

Every export is checked against PyTorch on two input sizes (the second non-square, batch 2): the command
prints the max abs difference and fails above ``atol``. Metadata (model config, classes, palette, mean,
std) travels with every format: ``model.yaml`` + ``classes.json`` next to the weights, and for ONNX also
inside ``model.onnx`` (metadata_props) so the file alone is enough for ``segattn.predict``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from torch import Tensor, nn

from ..attention import attention_class
from ..checkpoints.loading import WEIGHTS_FILE, load_exported, load_model, save_exported, write_metadata
from ..cli import run_command
from ..inference.onnx import METADATA_KEY, ONNX_FILE

FORMATS = ("onnx", "torchscript", "safetensors")
EXPORTERS = ("auto", "dynamo", "torchscript")
TORCHSCRIPT_FILE = "model.pt"


class ExportError(RuntimeError):
    """An export that failed or did not reproduce PyTorch; the message names the variant and the cause."""


class ExportWrapper(nn.Module):
    """Tensor in, tensor out: normalised images [B, 3, H, W] -> float32 logits [B, K, H, W]."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: Tensor) -> Tensor:
        return self.model(images).float()


def attention_name(info: dict[str, Any]) -> str:
    return str(info["model"].get("attention", "softmax"))


def check_sizes(height: int, width: int) -> list[tuple[int, int, int, int]]:
    """The export size at batch 1, then batch 2 at a second size: non-square, no multiple of a patch stride
    (so the model's padding runs), and not the size tracing exporters trace at."""
    second = (height * 3 // 4 + 3, width * 5 // 4 + 5)
    return [(1, 3, height, width), (2, 3, second[0], second[1] + (second[0] == second[1]))]


def trace_size(height: int, width: int) -> tuple[int, int]:
    """Where tracing exporters trace: not the export size, not a multiple of any patch stride.

    Tracing records only the branch taken; at the export (= training) size a ViT skips resampling its
    position embedding and needs no padding, and that trace would fail at any other size.
    """
    return height * 3 // 4 + 1, width * 5 // 4 - 1


def compare(
    reference: nn.Module, run: Any, shapes: list[tuple[int, ...]], atol: float, label: str
) -> list[dict[str, Any]]:
    """Max abs difference between PyTorch and an export on random inputs of each shape; raises above atol."""
    generator = torch.Generator().manual_seed(0)
    results = []
    for shape in shapes:
        images = torch.randn(shape, generator=generator)
        with torch.inference_mode():
            expected = reference(images)
        try:
            actual = torch.as_tensor(run(images))
        except Exception as error:
            raise ExportError(f"{label}: the export fails on input {list(shape)}: {error}") from None
        if actual.shape != expected.shape:
            raise ExportError(
                f"{label}: output {list(actual.shape)} for input {list(shape)}; "
                f"expected {list(expected.shape)}"
            )
        diff = (actual - expected).abs().max().item()
        print(f"{label}: max abs diff {diff:.2e} at input {'x'.join(map(str, shape))} (tolerance {atol:.0e})")
        if not diff <= atol:
            raise ExportError(
                f"{label}: max abs diff {diff:.3e} at input {list(shape)} exceeds tolerance {atol:.0e}"
            )
        results.append({"shape": list(shape), "max_abs_diff": diff})
    return results


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


def latency(runs: dict[str, Any], images: Tensor, repeats: int = 5) -> dict[str, float]:
    """Median wall time in ms of each ``run(images)``, after a warm-up; runs alternate so that load from
    other processes falls on all of them alike."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for step in range(repeats + 1):
        for name, run in runs.items():
            start = time.perf_counter()
            run(images)
            if step:
                times[name].append(1000 * (time.perf_counter() - start))
    return {name: sorted(values)[len(values) // 2] for name, values in times.items()}


def onnx_metadata(info: dict[str, Any], dynamic: bool, exporter: str) -> str:
    """The JSON embedded in model.onnx: everything predict needs besides onnxruntime, numpy and Pillow."""
    keys = ("num_classes", "classes", "palette", "mean", "std", "ignore_index", "model")
    meta = {key: info[key] for key in keys} | {
        "dataset": info.get("dataset"),
        "data_config": info.get("data_config"),
    }
    return json.dumps(meta | {"dynamic": dynamic, "exporter": exporter})


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
    names = {"input_names": ["images"], "output_names": ["logits"], "opset_version": opset}
    with warnings.catch_warnings(), silenced_output():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            auto = torch.export.Dim.AUTO
            shapes = ({0: auto, 2: auto, 3: auto} if dynamic else {0: auto},)
            torch.onnx.export(
                wrapper,
                (example,),
                str(path),
                dynamo=True,
                dynamic_shapes=shapes,
                external_data=False,  # one self-contained file: predict needs model.onnx alone
                verbose=False,
                **names,
            )
        else:
            axes = {0: "batch", 2: "height", 3: "width"} if dynamic else {0: "batch"}
            dynamic_axes = {"images": axes, "logits": axes}
            torch.onnx.export(
                wrapper,
                (example,),
                str(path),
                dynamo=False,
                dynamic_axes=dynamic_axes,
                verbose=False,
                **names,
            )


def onnx_attempt(
    wrapper: nn.Module, info: dict[str, Any], path: Path, opset: int, exporter: str, shapes: list, atol: float
) -> tuple[Any, list[dict[str, Any]]]:
    """Export with one exporter, embed the metadata, check in onnxruntime; (ORT runner, check results)."""
    import onnx
    import onnxruntime as ort

    dynamic = attention_class(attention_name(info)).onnx_dynamic
    label = f"onnx[{attention_name(info)}, {exporter} exporter]"
    # Batch 2: torch.export specialises a dimension whose example size is 0 or 1. A dynamic graph is
    # traced at trace_size so that the TorchScript-based exporter records the general branches.
    example = torch.randn(2, 3, *(trace_size(*shapes[0][2:]) if dynamic else shapes[0][2:]))
    torch_onnx_export(wrapper, example, path, opset, exporter, dynamic)
    proto = onnx.load(str(path))
    proto.metadata_props.add(key=METADATA_KEY, value=onnx_metadata(info, dynamic, exporter))
    onnx.save(proto, str(path))
    options = ort.SessionOptions()
    options.log_severity_level = 4  # shape errors surface as exceptions; keep ORT's own log quiet
    options.intra_op_num_threads = torch.get_num_threads()  # latency compares like with like
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    input_shape = session.get_inputs()[0].shape
    if dynamic and any(isinstance(dim, int) for dim in (input_shape[0], *input_shape[2:])):
        raise ExportError(f"{label}: graph input {input_shape}; expected symbolic batch, height, width")

    def run_ort(images: Tensor) -> Any:
        return session.run(None, {"images": images.numpy()})[0]

    return run_ort, compare(wrapper, run_ort, shapes, atol, label)


def export_onnx(
    model: nn.Module,
    info: dict[str, Any],
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
    name = attention_name(info)
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
            run_ort, results = onnx_attempt(wrapper, info, path, opset, attempt, shapes, atol)
            break
        except Exception as error:
            reason = first_line(error)
            errors.append(reason if isinstance(error, ExportError) else f"{attempt} exporter: {reason}")
            print(f"onnx[{name}]: {errors[-1]}", file=sys.stderr)
    else:
        path.unlink(missing_ok=True)
        raise ExportError(f"attention {name!r} cannot be exported to ONNX ({'; '.join(errors)})")
    write_metadata(info, out)
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


def export_torchscript(
    model: nn.Module, info: dict[str, Any], out: Path, size: tuple[int, int], atol: float
) -> dict[str, Any]:
    """model.pt traced at ``size`` (metadata in its extra files), checked on two sizes; refused by flag."""
    name = attention_name(info)
    label = f"torchscript[{name}]"
    if not attention_class(name).torchscript:
        raise ExportError(
            f"attention {name!r} does not support TorchScript (its class flag torchscript=False)"
        )
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
        torch.jit.save(traced, str(path), _extra_files={"segattn.json": onnx_metadata(info, True, "trace")})
        loaded = torch.jit.load(str(path))
    results = compare(wrapper, loaded, check_sizes(*size), atol, label)
    write_metadata(info, out)
    return {"format": "torchscript", "attention": name, "checks": results}


def export_safetensors(
    model: nn.Module, info: dict[str, Any], out: Path, size: tuple[int, int]
) -> dict[str, Any]:
    """model.safetensors + model.yaml + classes.json, reloaded with load_model; must match exactly."""
    name = attention_name(info)
    save_exported(model, info, out)
    reloaded, _ = load_exported(out)
    results = compare(
        ExportWrapper(model).eval(),
        ExportWrapper(reloaded).eval(),
        check_sizes(*size),
        0.0,
        f"safetensors[{name}]",
    )
    return {"format": "safetensors", "attention": name, "file": str(out / WEIGHTS_FILE), "checks": results}


def export(
    model: nn.Module,
    info: dict[str, Any],
    fmt: str,
    out: str | Path,
    size: tuple[int, int] = (512, 512),
    opset: int = 18,
    atol: float = 1e-4,
    exporter: str = "auto",
) -> dict[str, Any]:
    """Export ``model`` (as from ``segattn.load_model``) to ``out`` in format ``fmt``; a report dict."""
    if fmt not in FORMATS:
        raise ExportError(f"format={fmt!r}; expected one of {FORMATS}")
    if exporter not in EXPORTERS:
        raise ExportError(f"exporter={exporter!r}; expected one of {EXPORTERS}")
    model = model.eval()
    out = Path(out)
    if fmt == "onnx":
        return export_onnx(model, info, out, size, opset, atol, exporter)
    if fmt == "torchscript":
        return export_torchscript(model, info, out, size, atol)
    return export_safetensors(model, info, out, size)


def main(argv: list[str] | None = None) -> int:
    """``python -m segattn.export`` / ``segattn-export``: compose conf/export.yaml with ``argv``."""
    return run_command("segattn.export", "export", run, argv)


def run(args: DictConfig) -> int:
    """Export and verify; 1 (one line on stderr) when the model cannot be loaded, exported or matched."""
    if args.threads:
        torch.set_num_threads(args.threads)  # PyTorch and onnxruntime (latency report) alike
    try:
        model, info = load_model(args.checkpoint)
        start = time.perf_counter()
        report = export(
            model,
            info,
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
