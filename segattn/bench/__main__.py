"""``python -m segattn.bench {op,model,maxres,accuracy,raster,all} [--smoke] [--out DIR]``: see ``--help``
of each part (``all`` runs op, model and maxres; ``accuracy`` trains and ``raster`` streams a generated
20k² GeoTIFF through predict, each run on its own).

Defaults depend on the device (CPU grids are smaller); ``--smoke`` shrinks everything to seconds for CI.
Results go to ``bench_results/<timestamp>/`` (git-ignored) unless ``--out`` is given.

Flags, SEGATTN_KERNEL and (accuracy) the experiment with its ``--overrides`` are checked before the output
folder exists. A refusal or a failed run is one line on stderr (``segattn.errors``): status 2 for the
command line or the environment, 1 for a run that failed; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path
from typing import Any

import torch

from ..attention import available_attention
from ..cpu_memory import reuse_freed_memory
from ..errors import ConfigError
from . import report
from .arguments import parse_args
from .measure import total_memory_budget
from .specs import parse_count, parse_spec

# Per part and device kind ("smoke" for --smoke): the defaults of every option left unset.
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "op": {
        "smoke": {"sizes": ["256", "1k"], "repeats": 5, "config_seconds": 1.0, "max_call_seconds": 5.0},
        "cpu": {"sizes": ["1k", "4k", "16k", "64k", "256k"], "repeats": 5, "config_seconds": 20.0}
        | {"max_call_seconds": 60.0},
        "cuda": {"sizes": ["1k", "2k", "4k", "8k", "16k", "32k", "64k", "128k", "256k"], "repeats": 20}
        | {"config_seconds": 2.0, "max_call_seconds": 10.0, "kernels": ["torch", "triton"]},
    },
    "model": {
        "smoke": {"image_sizes": [64], "repeats": 5, "dtypes": ["fp32"], "max_step_seconds": 30.0},
        "cpu": {"image_sizes": [256, 512, 1024], "repeats": 5, "dtypes": ["fp32"], "max_step_seconds": 300.0},
        "cuda": {"image_sizes": [256, 512, 1024, 2048], "repeats": 10, "dtypes": ["bf16"]}
        | {"max_step_seconds": 30.0},
    },
    "maxres": {
        "smoke": {"start": 64, "step": 32, "max_size": 64, "budget_gib": 2.0, "probe_timeout": 120.0},
        "cpu": {"start": 512, "step": 128, "max_size": 8192, "budget_gib": None, "probe_timeout": 900.0},
        "cuda": {"start": 1024, "step": 128, "max_size": 16384, "budget_gib": None, "probe_timeout": 600.0},
    },
    "raster": {
        "smoke": {"size": 1024, "crop": 256},
        "cpu": {"size": 20000, "crop": 1024},
        "cuda": {"size": 20000, "crop": 1024},  # predict streams on the CPU either way
    },
    "accuracy": {
        "smoke": {"experiment": "accuracy_smoke", "seeds": [0], "repeats": 1, "budget_gib": 1.0}
        | {"start": 64, "step": 32, "max_size": 64, "probe_timeout": 120.0},
        "cpu": {"experiment": "accuracy_camvid_cpu", "seeds": [0, 1], "repeats": 3, "budget_gib": 2.0}
        | {"start": 512, "step": 128, "max_size": 16384, "probe_timeout": 300.0},
        "cuda": {"experiment": "accuracy_camvid_gpu", "seeds": [0, 1, 2], "repeats": 10, "budget_gib": None}
        | {"start": 1024, "step": 128, "max_size": 16384, "probe_timeout": 600.0},
    },
}


def preset(args: argparse.Namespace, part: str, device: torch.device) -> dict[str, Any]:
    """The preset for ``part`` with every option the user set on the command line laid over it."""
    values = dict(PRESETS[part]["smoke" if args.smoke else device.type])
    values.update({key: value for key, value in vars(args).items() if value is not None})
    return values


def run_op(args: argparse.Namespace, device: torch.device, out_dir: Path) -> None:
    from .op import OpSettings, run

    values = preset(args, "op", device)
    settings = OpSettings(
        variants=[parse_spec(text) for text in values.get("variants") or available_attention()],
        sizes=[parse_count(text) for text in values["sizes"]],
        dtypes=values.get("dtypes") or ["fp32", "bf16"],
        modes=values.get("modes") or ["fwd", "fwdbwd"],
        batch=values.get("batch", 1),
        dim=values.get("dim", 64),
        heads=values.get("heads", 2),
        repeats=values["repeats"],
        warmup=values.get("warmup", 2),
        config_seconds=values["config_seconds"],
        max_call_seconds=values["max_call_seconds"],
        clock=args.clock,
        memory=not args.no_memory,
        compile=args.compile,
        kernels=values.get("kernels") or ["auto"],
        profile=not values.get("no_profile"),
        cuda_graphs=bool(values.get("cuda_graphs")),
        profile_tokens=parse_count(values["profile_tokens"]) if values.get("profile_tokens") else None,
    )
    run(settings, device, out_dir)


def run_model(args: argparse.Namespace, device: torch.device, out_dir: Path) -> None:
    from .model import ModelSettings, default_models, default_variants, run

    values = preset(args, "model", device)
    variants = values.get("variants") or (default_variants(smoke=True) if args.smoke else None)
    settings = ModelSettings(
        models=[parse_spec(text) for text in values.get("models") or default_models(args.smoke)],
        variants=[parse_spec(text) for text in variants] if variants else None,
        image_sizes=values["image_sizes"],
        dtypes=values["dtypes"],
        batch=values.get("batch") or [1],
        repeats=values["repeats"],
        max_step_seconds=values["max_step_seconds"],
        clock=args.clock,
        memory=not args.no_memory,
        compile=args.compile,
        kernels=values.get("kernels") or ["auto"],
        time_budget=values.get("time_budget"),
    )
    run(settings, device, out_dir)


def run_maxres(args: argparse.Namespace, device: torch.device, out_dir: Path) -> None:
    from .maxres import MaxresSettings, default_models, default_variants, run

    values = preset(args, "maxres", device)
    settings = MaxresSettings(
        models=[parse_spec(text) for text in values.get("models") or default_models(args.smoke)],
        variants=[parse_spec(text) for text in values.get("variants") or default_variants(args.smoke)],
        budget_bytes=int(values["budget_gib"] * (1 << 30)) if values.get("budget_gib") else None,
        checkpointing={"off": [False], "on": [True], "both": [False, True]}[
            values.get("checkpointing", "both")
        ],
        start=values["start"],
        step=values["step"],
        max_size=values["max_size"],
        probe_timeout=values["probe_timeout"],
        dtype=values.get("dtype") or ("bf16" if device.type == "cuda" else "fp32"),
        extrapolate_gib=values.get("extrapolate_gib", 24.0),
        bands=values.get("spatial") or [1],
        compile=args.compile,
        kernels=values.get("kernels") or ["auto"],
    )
    run(settings, device, out_dir)


def run_accuracy(args: argparse.Namespace, device: torch.device, out_dir: Path) -> None:
    from .accuracy import AccuracySettings, default_variants, run
    from .arms import experiment_table

    values = preset(args, "accuracy", device)
    budget = values.get("budget_gib")
    table = experiment_table(values["experiment"], values.get("overrides") or [])
    if values.get("variants"):
        variants = [parse_spec(text) for text in values["variants"]]
    elif table is not None:  # the arms the experiment file lists, or those of them --arms names
        variants = table.select(values.get("arms"), values["experiment"])
    else:
        variants = [parse_spec(text) for text in default_variants(args.smoke)]
    settings = AccuracySettings(
        experiment=values["experiment"],
        variants=variants,
        seeds=table.seeds if table is not None and args.seeds is None else values["seeds"],
        overrides=values.get("overrides") or [],
        jobs=values.get("jobs", 1),
        threads=args.threads,
        repeats=values["repeats"],
        maxres_budget_gib=None if args.no_maxres else budget or total_memory_budget(device) / (1 << 30),
        maxres_start=values["start"],
        maxres_step=values["step"],
        maxres_max_size=values["max_size"],
        maxres_timeout=values["probe_timeout"],
        clock=args.clock,
        only=values.get("only"),
    )
    run(settings, device, out_dir)


def run_raster(args: argparse.Namespace, device: torch.device, out_dir: Path) -> None:
    from .raster import run, settings_from

    run(settings_from(preset(args, "raster", device)), out_dir)


def check_before_writing(args: argparse.Namespace, device: torch.device) -> None:
    """What would fail after the output folder exists: SEGATTN_KERNEL (every part builds attention
    modules) and, for accuracy, the experiment composed with ``--overrides`` and train.py's value checks."""
    from ..config import check_kernel, check_values

    check_kernel()
    if getattr(args, "cuda_graphs", False) and device.type != "cuda":
        raise ConfigError(f"--cuda-graphs: CUDA graphs need a CUDA device; this run is on {device}")
    if args.part == "accuracy":
        from ..cli import compose_command

        values = preset(args, "accuracy", device)
        overrides = [f"experiment={values['experiment']}", *(values.get("overrides") or [])]
        check_values(compose_command("train", overrides), "train")


def main(argv: list[str] | None = None) -> None:
    """The bench's error boundary: a refusal (``cli.refusal``) is one line and its status, unless
    ``--debug``."""
    args = parse_args(argv, __doc__)
    try:
        bench(args)
    except Exception as error:
        from ..cli import refusal, said_line

        said = refusal(error)
        if said is None or args.debug:
            raise
        print(f"python -m segattn.bench {args.part}: {said_line(said)}", file=sys.stderr)
        raise SystemExit(said.status) from None


def bench(args: argparse.Namespace) -> None:
    reuse_freed_memory()  # as a training run with the same environment; memory children set their own
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and device.index is None:  # memory-fraction calls need an explicit index
        device = torch.device("cuda", torch.cuda.current_device())
    if args.threads:
        torch.set_num_threads(args.threads)
    check_before_writing(args, device)
    out_dir = args.out or Path("bench_results") / datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir.mkdir(parents=True, exist_ok=True)
    report.write_environment(out_dir, report.environment(device))
    runners = {
        "op": run_op,
        "model": run_model,
        "maxres": run_maxres,
        "accuracy": run_accuracy,
        "raster": run_raster,
    }
    for part in ["op", "model", "maxres"] if args.part == "all" else [args.part]:
        runners[part](args, device, out_dir)
    report.console.print(f"[bold]results:[/] {out_dir}")


if __name__ == "__main__":
    main()
