"""python -m segattn.bench op|model|maxres|raster|traffic [key=value ...]

Speed, memory and reach, one part at a time, each configured by Hydra like every segattn command
(conf/bench/<part>.yaml; `python -m segattn.bench <part> --help` lists its keys):
  op        each attention variant's token mixing against the memory-traffic floor
  model     one full training step per model, variant, image size and batch
  maxres    the largest square image that trains within a memory budget
  raster    streaming predict of a generated GeoTIFF: peak resident memory, windows per second
  predict   a trained model's images/s, files to masks and the network alone, torch and ONNX side by side
  traffic   bytes a training step moves by component, counted on fake tensors on the CPU

A key left null takes its value from the part's grid (grid=auto: cuda on a GPU, else cpu; grid=smoke:
seconds, for CI). Results go to bench_results/<timestamp>/ (git-ignored) unless out= is given. Every key,
SEGATTN_KERNEL, the variants, models and kernels (triton needs CUDA or TRITON_INTERPRET=1) are checked
before the output folder exists: a refusal is one line on stderr and status 2, a failed run status 1;
HYDRA_FULL_ERROR=1 shows the traceback instead. Accuracy studies are `train.py -m` sweeps
(docs/accuracy.md).
"""

from __future__ import annotations

import datetime
import os
import sys
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from ..attention import available_attention
from ..cli import run_command
from ..cpu_memory import reuse_freed_memory
from ..errors import EXIT_CONFIG, ConfigError
from . import report
from .specs import STEP_OPTIONS, Spec, parse_count, parse_image_size, spec_of

PROG = "python -m segattn.bench"
PARTS = ("op", "model", "maxres", "raster", "predict", "traffic")
GROUPS = {"traffic": ("model", "attention", "loss")}  # train.py's config groups a part composes


def main(argv: list[str] | None = None) -> int:
    """``python -m segattn.bench <part> key=value ...`` / ``segattn-bench``: the part's config
    (conf/bench/<part>.yaml) composed with the overrides, through the error boundary of every command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    part = argv[0] if argv else ""
    if part in ("", "--help", "-h"):
        print(__doc__.strip())
        return 0
    if part not in PARTS:
        print(f"{PROG}: {part!r} is not a part; expected one of {', '.join(PARTS)}", file=sys.stderr)
        return EXIT_CONFIG
    return run_command(
        f"{PROG} {part}", f"bench/{part}", lambda cfg: bench(part, cfg), argv[1:], GROUPS.get(part, ())
    )


def bench(part: str, cfg: DictConfig) -> int:
    """Check the part's settings on the device, then create the output folder and run the part."""
    reuse_freed_memory()  # as a training run with the same environment; memory children set their own
    device = torch.device(  # a part without the key (traffic) runs on the CPU
        OmegaConf.select(cfg, "device", default="cpu") or ("cuda" if torch.cuda.is_available() else "cpu")
    )
    if device.type == "cuda" and device.index is None:  # memory-fraction calls need an explicit index
        device = torch.device("cuda", torch.cuda.current_device())
    values = with_grid(cfg, device)
    run = SETTINGS[part](values, cfg, device)
    if cfg.get("threads"):
        torch.set_num_threads(cfg.threads)
    out_dir = Path(cfg.out or Path("bench_results") / datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    out_dir.mkdir(parents=True, exist_ok=True)
    report.write_environment(out_dir, report.environment(device))
    run(out_dir)
    report.console.print(f"[bold]results:[/] {out_dir}")
    return 0


def with_grid(cfg: DictConfig, device: torch.device) -> dict[str, Any]:
    """The part's keys as plain values, each null one taken from the grid (``grid=auto``: the device's);
    a part without grids (traffic) as they are."""
    values = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(values, dict)
    if "grids" not in values:
        return values
    grid = device.type if cfg.grid == "auto" else cfg.grid
    chosen = values.pop("grids")[grid]
    return values | {key: value for key, value in chosen.items() if values.get(key) is None}


def specs(key: str, listed: list[Any]) -> list[Spec]:
    """The variants or models of ``key`` as specs; one that has no name is a ConfigError naming the key."""
    try:
        return [spec_of(value) for value in listed]
    except ValueError as error:
        raise ConfigError(f"{key}: {error}") from None


def variants(listed: list[Any]) -> list[Spec]:
    """``variants``: registered attention names, each with its options."""
    out = specs("variants", listed)
    unknown = [spec.name for spec in out if spec.name not in available_attention()]
    if unknown:
        raise ConfigError(
            f"variants={unknown[0]!r}: unknown attention; expected one of {', '.join(available_attention())}"
        )
    return out


def models(listed: list[Any]) -> list[Spec]:
    """``models``: families that build with their options, checked on the meta device (no memory); the
    step's own options (``STEP_OPTIONS``: the loss's row chunks) beside them."""
    from ..models import build_model

    out = specs("models", listed)
    for spec in out:
        network = {key: value for key, value in spec.options.items() if key not in STEP_OPTIONS}
        rows = spec.options.get("loss_chunk_rows")
        if rows is not None and not (isinstance(rows, int) and not isinstance(rows, bool) and rows >= 1):
            raise ConfigError(f"models={spec.label}: loss_chunk_rows={rows!r}; expected an integer >= 1")
        try:
            with torch.device("meta"):
                build_model(spec.name, num_classes=2, attention="linear", **network)
        except (ValueError, TypeError) as error:
            raise ConfigError(f"models={spec.label}: {error}") from None
    return out


def kernels(listed: list[str], device: torch.device, tunings: bool) -> list[str]:
    """``kernels``: SEGATTN_KERNEL values (auto, torch, triton, an opt-in form's name; with ``tunings``,
    ``triton:BxWxP`` too). Triton runs on a CUDA device, or anywhere under TRITON_INTERPRET=1."""
    from ..attention.triton.launch import Tuning
    from ..layers.fast_path import KERNEL_BACKENDS

    for kernel in listed:
        backend, _, tuning = str(kernel).partition(":")
        if backend not in KERNEL_BACKENDS or (tuning and (backend != "triton" or not tunings)):
            expected = ", ".join(KERNEL_BACKENDS) + (" or triton:BxWxP" if tunings else "")
            raise ConfigError(f"kernels={kernel!r}: expected {expected}")
        if tuning:
            try:
                Tuning.parse(tuning)
            except ValueError as error:
                raise ConfigError(f"kernels={kernel!r}: {error}") from None
        if backend == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ConfigError(
                f"kernels={kernel!r}: the Triton kernels need a CUDA device (or TRITON_INTERPRET=1); this "
                f"run is on {device}"
            )
    return [str(kernel) for kernel in listed]


Run = Callable[[Path], object]


def op_settings(values: dict[str, Any], cfg: DictConfig, device: torch.device) -> Run:
    from .op import OpSettings, run

    if values["cuda_graphs"] and device.type != "cuda":
        raise ConfigError(f"cuda_graphs=true: CUDA graphs need a CUDA device; this run is on {device}")
    settings = OpSettings(
        variants=variants(values["variants"] or available_attention()),
        sizes=[parse_count(str(tokens)) for tokens in values["tokens"]],
        dtypes=values["dtypes"],
        modes=values["modes"],
        batch=values["batch"],
        dim=values["dim"],
        heads=values["heads"],
        repeats=values["repeats"],
        warmup=values["warmup"],
        config_seconds=values["config_seconds"],
        max_call_seconds=values["max_call_seconds"],
        clock=values["clock"],
        memory=values["memory"],
        compile=values["compile"],
        kernels=kernels(values["kernels"], device, tunings=True),
        profile=values["profile"],
        cuda_graphs=values["cuda_graphs"],
        profile_tokens=parse_count(str(values["profile_tokens"])) if values["profile_tokens"] else None,
    )
    return lambda out_dir: run(settings, device, out_dir)


def model_settings(values: dict[str, Any], cfg: DictConfig, device: torch.device) -> Run:
    from .model import ModelSettings, run

    sizes = [parse_image_size(size) for size in values["image_sizes"]]
    profile_size = values["profile_size"] and parse_image_size(values["profile_size"])
    if profile_size and profile_size not in sizes:
        raise ConfigError(
            f"profile_size={values['profile_size']}: not one of image_sizes={values['image_sizes']}"
        )
    settings = ModelSettings(
        models=models(values["models"]),
        variants=variants(values["variants"]) if values["variants"] else None,
        image_sizes=sizes,
        dtypes=values["dtypes"],
        batch=values["batch"],
        repeats=values["repeats"],
        max_step_seconds=values["max_step_seconds"],
        clock=values["clock"],
        memory=values["memory"],
        compile=values["compile"],
        kernels=kernels(values["kernels"], device, tunings=False),
        time_budget=values["time_budget"],
        profile=values["profile"],
        profile_size=profile_size or None,
    )
    return lambda out_dir: run(settings, device, out_dir)


def maxres_settings(values: dict[str, Any], cfg: DictConfig, device: torch.device) -> Run:
    from .maxres import MaxresSettings, run

    settings = MaxresSettings(
        models=models(values["models"]),
        variants=variants(values["variants"]),
        budget_bytes=int(values["budget_gib"] * (1 << 30)) if values["budget_gib"] else None,
        checkpointing={"off": [False], "on": [True], "both": [False, True]}[values["checkpointing"]],
        start=values["start"],
        step=values["step"],
        max_size=values["max_size"],
        probe_timeout=values["probe_timeout"],
        dtype=values["dtype"] or ("bf16" if device.type == "cuda" else "fp32"),
        extrapolate_gib=values["extrapolate_gib"],
        bands=values["spatial"],
        compile=values["compile"],
        kernels=kernels(values["kernels"], device, tunings=False),
    )
    return lambda out_dir: run(settings, device, out_dir)


def raster_settings(values: dict[str, Any], cfg: DictConfig, device: torch.device) -> Run:
    from ..tiling import default_stride
    from .raster import RasterSettings, run

    crop = values["crop"]
    settings = RasterSettings(
        size=values["size"],
        crop=crop,
        stride=values["stride"] or default_stride((crop, crop))[0],
        crop_batch_size=values["crop_batch_size"],
        classes=values["classes"],
        threads=values["threads"],
        baseline=values["baseline"],
    )
    return lambda out_dir: run(settings, out_dir)


def predict_settings(values: dict[str, Any], cfg: DictConfig, device: torch.device) -> Run:
    """The model opened on the device and every precision checked there, before the output folder exists:
    torch rows need a torch model, ONNX rows on a GPU onnxruntime-gpu, fp16 a CUDA device."""
    import onnxruntime

    from ..inference.device import onnx_providers, resolved_precision
    from ..inference.trained import open_model
    from .predict import PredictSettings, run

    formats, where = values["formats"], str(device)
    try:
        model = values["checkpoint"] and open_model(values["checkpoint"], values["threads"], where)
        if "onnx" in formats:
            onnx_providers(where, onnxruntime.get_available_providers())
        bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        for precision in values["precisions"] if "torch" in formats else ():
            resolved_precision(precision, where, False, bf16)
    except (FileNotFoundError, ValueError) as error:
        raise ConfigError(str(error)) from None
    if model and model.session is not None and "torch" in formats:
        raise ConfigError(
            f"formats={formats}: checkpoint={values['checkpoint']} is an ONNX model, which has no torch "
            "rows; use formats=[onnx], or the checkpoint or safetensors export it came from"
        )
    settings = PredictSettings(
        model=model or None,
        formats=formats,
        image_sizes=[parse_image_size(size) for size in values["image_sizes"]],
        batch=values["batch"],
        num_workers=values["num_workers"],
        precisions=values["precisions"],
        images=values["images"],
        overlays=values["overlays"],
        repeats=values["repeats"],
        threads=values["threads"],
    )
    return lambda out_dir: run(settings, device, out_dir)


def traffic_settings(values: dict[str, Any], cfg: DictConfig, device: torch.device) -> Run:
    """train.py's module for the model, attention and loss groups, built before the output folder exists
    (options it refuses are a ConfigError)."""
    from ..layers.fast_path import paths_of_a_gpu
    from .model import training_module
    from .specs import kernel_path
    from .traffic import run

    kwargs = {**values["model"], "num_classes": values["num_classes"]}
    kwargs |= {"attention": values["attention"]["name"], "attention_options": values["attention"]["options"]}
    try:
        with kernel_path(values["kernel"]), paths_of_a_gpu() if values["paths"] == "gpu" else nullcontext():
            module = training_module(kwargs, values["loss"])
    except (ValueError, TypeError) as error:
        raise ConfigError(
            f"model={values['model']['name']} attention={kwargs['attention']}: {error}"
        ) from None
    return lambda out_dir: run(module, values, out_dir)


SETTINGS: dict[str, Callable[[dict[str, Any], DictConfig, torch.device], Run]] = {
    "op": op_settings,
    "model": model_settings,
    "maxres": maxres_settings,
    "raster": raster_settings,
    "predict": predict_settings,
    "traffic": traffic_settings,
}


if __name__ == "__main__":
    sys.exit(main())
