"""``bench accuracy``: test mIoU against training cost for every attention variant, trained alike.

Every (variant, seed) is one ``train.py`` run of the same experiment (model, data, crop, epochs, schedule)
in its own directory ``<out>/runs/<variant>-seed<seed>``, which tests its best checkpoint on the test
split (``test_after_fit``). Runs are resumable: a finished run (its ``summary.json`` holds test scores) is
kept, an interrupted one continues from its ``last.ckpt``, so rerunning the same command completes the
table. Costs are measured after training, in one process for all variants so that ratios are fair:
``bench model``'s training step at the experiment's batch and crop (time round-robin, peak memory in
fresh children) and ``bench maxres``'s largest square image at batch 1 within a memory budget. Costs are
kept in ``costs.json`` as they are measured (the step block whole, maxres per variant) and reused by a
rerun with the same recipe and settings; ``only="costs"`` measures them while another process trains, and
``only="table"`` tables the runs finished so far without training the rest.
Results: ``accuracy.csv`` (one row per run), ``accuracy_table.csv`` / ``accuracy.md`` (one row per
variant) and ``accuracy.png`` (mIoU against time per step, marker area = peak memory).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..attention import attention_class, attention_options
from ..errors import SegattnError
from ..files import atomic_write
from ..images import as_hw
from .maxres import MaxresSettings, find_maxres
from .measure import total_memory_budget
from .model import ModelSettings, measure_memory, time_steps
from .report import console, format_bytes, format_seconds, print_table, progress, write_csv
from .resolution import average_precision_markdown, plot_resolution
from .specs import Spec, parse_spec

PACKAGE_PARENT = Path(__file__).resolve().parents[2]  # where this segattn is imported from


@dataclass
class AccuracySettings:
    experiment: str  # conf/experiment/<name>.yaml: the recipe every run shares
    variants: list[Spec]
    seeds: list[int]
    overrides: list[str]  # Hydra overrides added to every run (e.g. data.root=...)
    jobs: int = 1  # runs side by side, each with cores // jobs threads
    threads: int | None = None  # threads of each training run; None: cores // jobs
    repeats: int = 3
    maxres_budget_gib: float | None = 2.0  # None: skip the maxres column
    maxres_start: int = 512
    maxres_step: int = 128
    maxres_max_size: int = 16384
    maxres_timeout: float = 300.0
    clock: str = "wall"  # step timing clock: wall, or process CPU time (steady on a busy machine)
    only: str | None = None  # "train", "costs" or "table" (of the finished runs): one phase; None: all


IDRID_ARMS = [
    "flatten",
    *[f"flatten:label=flatten-x{factor}:data.downsample={factor}" for factor in (2, 4, 8)],
    "sra",
    # softmax without reduction at the largest crop whose training step costs what flatten's 512² one does
    "softmax:label=softmax-320:sr_ratios=[1,1,1,1]:data.crop_size=[320,320]:inference.crop=[320,320]"
    ":inference.stride=[320,320]",
    "linear",
    "litemla:label=efficientvit-litemla:model=efficientvit",
]


def default_variants(smoke: bool, experiment: str = "") -> list[str]:
    """PVT's softmax without and with its own spatial reduction (``sra``: 8/4/2/1), then the linear ones;
    Linformer at the 128² training crop (1,024 stage-1 tokens), which also bounds its evaluation; then
    the 2023-25 ones (Agent Attention, PolaFormer, EfficientViT's LiteMLA) at full resolution. For the
    IDRiD experiments (``idrid_*``) the arms of the resolution table instead (``IDRID_ARMS``)."""
    if smoke:
        return ["sra", "linear"]
    if experiment.startswith("idrid"):
        return list(IDRID_ARMS)
    return [
        *["softmax:sr_ratios=[1,1,1,1]", "sra", "efficient", "linear", "taylor", "flatten"],
        *["performer", "nystrom", "linformer:max_tokens=1024"],
        *["agent", "pola", "litemla"],
    ]


@dataclass(frozen=True)
class Recipe:
    """What the cost measurements take from the composed experiment: the same network, batch and crop;
    and the classes its mAP averages (``metrics.ap_mean_classes``), which the resolution plot shows."""

    model: Spec
    batch: int
    crop: int
    mean_classes: list[str] | None = None


def read_recipe(experiment: str, overrides: list[str]) -> Recipe:
    """Compose ``train.py experiment=<name> <overrides>`` and keep the model, batch size and crop side."""
    from ..cli import compose_command
    from ..config import plain

    cfg = compose_command("train", [f"experiment={experiment}", *overrides])
    options = plain(cfg.model)
    name = options.pop("name")
    for key in ("compile", "pretrained"):  # how it trains and starts, not the network that is timed
        options.pop(key, None)
    crop = as_hw(cfg.data.crop_size, "data.crop_size")
    if crop[0] != crop[1]:
        raise ValueError(
            f"bench accuracy: data.crop_size={list(crop)}; the step cost is measured on square crops"
        )
    label = f"{name}-{options['size']}" if options.get("size") else name
    mean_classes = cfg.metrics.ap_mean_classes
    mean_classes = None if mean_classes is None else [str(c) for c in mean_classes]
    return Recipe(Spec(name, options, label), int(cfg.data.batch_size), crop[0], mean_classes)


CONFIG_GROUPS = ("model", "data", "loss", "optimizer", "scheduler", "trainer", "inference", "metrics")


def is_run_override(key: str) -> bool:
    """Whether a spec option is a plain Hydra override of the run (``data.downsample``, ``model``) rather
    than an option of the attention or the model."""
    return "." in key or key in CONFIG_GROUPS


def run_overrides(variant: Spec) -> list[str]:
    """The spec's plain Hydra overrides: ``data.downsample=4``, ``model=efficientvit``."""
    return [
        f"{key}={value if isinstance(value, str) else json.dumps(value)}"
        for key, value in variant.options.items()
        if is_run_override(key)
    ]


def spec_overrides(variant: Spec) -> list[str]:
    """``attention=<name>`` plus each option as an attention or a model override (``sr_ratios`` is PVT's),
    or as itself where it names a config key or group (``run_overrides``)."""
    accepted = set(attention_options(variant.name))
    overrides = [f"attention={variant.name}", *run_overrides(variant)]
    for key, value in variant.options.items():
        if is_run_override(key):
            continue
        key = f"++attention.options.{key}" if key in accepted else f"model.{key}"
        overrides.append(f"{key}={json.dumps(value)}")
    if not attention_class(variant.name).onnx_dynamic:
        # Tied to a token count: evaluate by sliding the training crop over the image, its trained size, at
        # the default stride for that window (a preset's stride may be wider than it)
        overrides += ["inference.mode=slide", "inference.crop=${data.crop_size}", "inference.stride=null"]
    return overrides


def run_name(variant: Spec, seed: int) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in variant.label)
    return f"{safe}-seed{seed}"


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """The finished run's summary (None while it has no test scores)."""
    path = run_dir / "summary.json"
    if not path.is_file():
        return None
    summary = json.loads(path.read_text())
    return summary if summary.get("test") else None


def train_one(settings: AccuracySettings, variant: Spec, seed: int, runs_dir: Path) -> dict[str, Any]:
    """Train (or resume, or reuse) one run; return its result row."""
    run_dir = runs_dir / run_name(variant, seed)
    row: dict[str, Any] = {"variant": variant.label, "seed": seed, "run_dir": str(run_dir)}
    summary = read_summary(run_dir)
    if summary is None:
        command = [sys.executable, "-m", "segattn.training", f"experiment={settings.experiment}"]
        command += [*settings.overrides, *spec_overrides(variant), f"seed={seed}"]
        command += [f"run_name={run_name(variant, seed)}", f"hydra.run.dir={run_dir}"]
        last = run_dir / "checkpoints" / "last.ckpt"
        if last.is_file():
            command.append(f"ckpt_path={last}")
        threads = str(settings.threads or max(1, (os.cpu_count() or 1) // settings.jobs))
        env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_PARENT), env.get("PYTHONPATH")]))
        run_dir.mkdir(parents=True, exist_ok=True)
        progress(f"accuracy: training {run_dir.name}{' (resuming)' if last.is_file() else ''}")
        start = time.perf_counter()
        with open(run_dir / "train_stdout.log", "a") as log:
            result = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env, check=False)
        elapsed = time.perf_counter() - start
        summary = read_summary(run_dir)
        if result.returncode != 0 or summary is None:
            progress(f"accuracy: {run_dir.name} failed (exit {result.returncode}); see {log.name}")
            return row | {"status": "failed", "note": f"exit {result.returncode}, see {log.name}"}
        (run_dir / "train_seconds.txt").write_text(f"{elapsed:.1f}\n")
        progress(
            f"accuracy: {run_dir.name} test mIoU {summary['test']['mIoU']:.2f} in {elapsed / 60:.1f} min"
        )
    return row | finished_row(run_dir, summary)


def finished_row(run_dir: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """A finished run's columns of ``accuracy.csv``: its test scores (with average precision and the
    per-class AP and IoU where the run scored them), steps and training time."""
    seconds_file = run_dir / "train_seconds.txt"
    test = summary["test"]
    row = {
        "status": "ok",
        "test_mIoU": test["mIoU"],
        "test_mAcc": test["mAcc"],
        "test_aAcc": test["aAcc"],
        "best_val_mIoU": summary["best_mIoU"],
        "steps": summary["steps"],
        "train_seconds": float(seconds_file.read_text()) if seconds_file.is_file() else None,
        "note": "",
    }
    if "mAP" in test:
        row |= {
            "test_mAP": test["mAP"],
            "best_val": summary.get("best_score"),
            "monitor": summary.get("monitor"),
        }
        row |= {f"test_AP_{name}": value for name, value in test["AP"].items()}
        row |= {f"test_IoU_{name}": value for name, value in test["IoU"].items()}
        if summary.get("test_last"):  # test_last=true: the final weights were tested too
            row["test_last_mAP"] = summary["test_last"]["mAP"]
    return row


def finished_runs(settings: AccuracySettings, out_dir: Path) -> list[dict[str, Any]]:
    """The runs that have test scores, in the table's order; nothing is trained."""
    rows = []
    for seed in settings.seeds:
        for variant in settings.variants:
            run_dir = out_dir / "runs" / run_name(variant, seed)
            summary = read_summary(run_dir)
            if summary is not None:
                rows.append({"variant": variant.label, "seed": seed, "run_dir": str(run_dir)})
                rows[-1].update(finished_row(run_dir, summary))
    return rows


def train_all(settings: AccuracySettings, out_dir: Path) -> list[dict[str, Any]]:
    """All (variant, seed) runs, ``jobs`` at a time, in a fixed order (seed-major, so a table with one
    seed of every variant exists before the second seed starts)."""
    runs_dir = out_dir / "runs"
    jobs = [(variant, seed) for seed in settings.seeds for variant in settings.variants]
    with ThreadPoolExecutor(max_workers=settings.jobs) as pool:
        futures = [pool.submit(train_one, settings, variant, seed, runs_dir) for variant, seed in jobs]
        return [future.result() for future in futures]


COSTS_FILE = "costs.json"


def cost_settings(settings: AccuracySettings, recipe: Recipe, device: torch.device) -> dict[str, Any]:
    """What the costs depend on: a ``costs.json`` measured under other values is measured again."""
    return {
        "model": recipe.model.label,
        "model_options": recipe.model.options,
        "batch": recipe.batch,
        "crop": recipe.crop,
        "device": str(device),
        "repeats": settings.repeats,
        "clock": settings.clock,
        "maxres_budget_gib": settings.maxres_budget_gib,
        "maxres": [
            settings.maxres_start,
            settings.maxres_step,
            settings.maxres_max_size,
            settings.maxres_timeout,
        ],
    }


def read_costs(path: Path, key: dict[str, Any]) -> dict[str, Any]:
    """The costs measured so far under ``key`` (empty when none, or measured under other settings)."""
    if path.is_file():
        stored = json.loads(path.read_text())
        if stored.get("settings") == key:
            return stored
    return {"settings": key, "steps": {}, "maxres": {}}


def write_costs(path: Path, costs: dict[str, Any]) -> None:
    """Crash-safe: an interrupted write leaves the previous file, never half of one."""
    atomic_write(path, lambda handle: handle.write((json.dumps(costs, indent=2) + "\n").encode()))


def arm_recipe(settings: AccuracySettings, variant: Spec) -> tuple[Recipe, Spec]:
    """The network, batch and crop one arm trains with (the experiment under the arm's own run overrides:
    another model, crop or scale), and the arm as a ``bench model`` variant (its other options)."""
    recipe = read_recipe(settings.experiment, [*settings.overrides, *run_overrides(variant)])
    options = {key: value for key, value in variant.options.items() if not is_run_override(key)}
    return recipe, Spec(variant.name, options, variant.label)


def measure_costs(
    settings: AccuracySettings, recipe: Recipe, device: torch.device, out_dir: Path
) -> dict[str, dict]:
    """Per variant: training-step seconds and peak memory at its batch and crop, and the largest trainable
    square image at batch 1 within the maxres budget; reused from ``costs.json``. Arms that train the same
    network at the same batch and crop are timed together (round-robin), so their ratios are fair; arms
    that differ only in their data (``data.downsample``) share one timing."""
    path = out_dir / COSTS_FILE
    stored = read_costs(path, cost_settings(settings, recipe, device))
    labels = [variant.label for variant in settings.variants]
    groups: dict[str, tuple[Recipe, list[Spec]]] = {}
    for variant in settings.variants:
        arm, spec = arm_recipe(settings, variant) if run_overrides(variant) else (recipe, variant)
        key = json.dumps([arm.model.label, arm.model.options, arm.batch, arm.crop], sort_keys=True)
        groups.setdefault(key, (arm, []))[1].append(spec)
    for arm, specs in groups.values():
        if all(spec.label in stored["steps"] for spec in specs):
            continue
        twins: dict[str, list[str]] = {}  # one timing per distinct network: flatten-x4 trains flatten's
        unique: dict[str, Spec] = {}
        for spec in specs:
            key = json.dumps([spec.name, spec.options], sort_keys=True)
            unique.setdefault(key, spec)
            twins.setdefault(unique[key].label, []).append(spec.label)
        model_settings = ModelSettings(
            models=[arm.model],
            variants=list(unique.values()),
            image_sizes=[arm.crop],
            dtypes=["fp32"],
            batch=arm.batch,
            repeats=settings.repeats,
            max_step_seconds=float("inf"),
            clock=settings.clock,
        )
        rows = time_steps(model_settings, device)
        measure_memory(rows, model_settings, device)
        for row in rows:
            if row["status"] == "ok":
                for label in twins[row["variant"]]:
                    stored["steps"][label] = {
                        "step_seconds": row.get("seconds"),
                        "peak_bytes": row.get("peak_bytes"),
                    }
        write_costs(path, stored)
    if settings.maxres_budget_gib:
        budget = int(settings.maxres_budget_gib * (1 << 30))
        maxres = MaxresSettings(
            models=[recipe.model],
            variants=settings.variants,
            budget_bytes=budget,
            checkpointing=[False],
            start=settings.maxres_start,
            step=settings.maxres_step,
            max_size=settings.maxres_max_size,
            probe_timeout=settings.maxres_timeout,
            extrapolate_gib=None,
        )
        budget = min(budget, total_memory_budget(device, fraction=0.9))
        for variant in settings.variants:
            if variant.label not in stored["maxres"]:
                row, _ = find_maxres(recipe.model, variant, False, 1, maxres, budget, device)
                stored["maxres"][variant.label] = {
                    "maxres": row["maxres"],
                    "maxres_limited_by": row["limited_by"],
                }
                write_costs(path, stored)
    return {
        label: {**stored["steps"].get(label, {}), **stored["maxres"].get(label, {})}
        for label in labels
        if label in stored["steps"] or label in stored["maxres"]
    }


def mean_or_none(values: list[float | None]) -> float | None:
    """The mean of the defined values (NaN and None left out), None without any."""
    kept = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.fmean(kept) if kept else None


def summarize(
    runs: list[dict[str, Any]], costs: dict[str, dict[str, Any]], variants: list[Spec]
) -> list[dict]:
    """One row per variant: mean and spread of test mIoU (and mAP, where scored) over seeds, the mean of
    each per-class column, and the costs."""
    table = []
    for variant in variants:
        mine = [r for r in runs if r["variant"] == variant.label and r["status"] == "ok"]
        scores = [r["test_mIoU"] for r in mine]
        row: dict[str, Any] = {"variant": variant.label, "seeds": len(scores)}
        row["attention"] = variant.name
        row["downsample"] = int(variant.options.get("data.downsample", 1))
        row["monitor"] = mine[0].get("monitor") if mine else None
        row["test_mIoU_mean"] = statistics.fmean(scores) if scores else None
        row["test_mIoU_std"] = statistics.stdev(scores) if len(scores) > 1 else None
        row["test_mIoU_runs"] = " ".join(f"{s:.2f}" for s in scores)
        row["test_mAcc_mean"] = statistics.fmean(r["test_mAcc"] for r in mine) if mine else None
        average_precision = [
            r["test_mAP"] for r in mine if r.get("test_mAP") is not None and not math.isnan(r["test_mAP"])
        ]
        if average_precision:
            row["test_mAP_mean"] = statistics.fmean(average_precision)
            row["test_mAP_std"] = statistics.stdev(average_precision) if len(average_precision) > 1 else None
            row["test_mAP_runs"] = " ".join(f"{s:.2f}" for s in average_precision)
        per_class = [
            key
            for key in (mine[0] if mine else {})
            if key.startswith(("test_AP_", "test_IoU_", "test_last_"))
        ]
        row |= {f"{key}_mean": mean_or_none([r.get(key) for r in mine]) for key in per_class}
        times = [r["train_seconds"] for r in mine if r.get("train_seconds")]
        row["train_minutes_mean"] = statistics.fmean(times) / 60 if times else None
        table.append(row | costs.get(variant.label, {}))
    return table


def miou_markdown(table: list[dict[str, Any]], budget_text: str) -> str:
    """The README table of test mIoU against cost."""
    lines = [
        "| variant | test mIoU (mean ± std) | runs | s/step | peak memory / step | "
        f"largest image, batch 1, {budget_text} |",
        "|---|---|---|---|---|---|",
    ]
    for row in table:
        mean, std = row["test_mIoU_mean"], row["test_mIoU_std"]
        score = "-" if mean is None else f"{mean:.2f}" + ("" if std is None else f" ± {std:.2f}")
        step = format_seconds(row["step_seconds"]) if row.get("step_seconds") else "-"
        peak = format_bytes(row["peak_bytes"]) if row.get("peak_bytes") else "-"
        maxres = f"{row['maxres']}² ({row['maxres_limited_by']})" if row.get("maxres") is not None else "-"
        lines.append(
            f"| `{row['variant']}` | {score} | {row['test_mIoU_runs']} | {step} | {peak} | {maxres} |"
        )
    return "\n".join(lines) + "\n"


def markdown(table: list[dict[str, Any]], budget_text: str) -> str:
    """The README table: by average precision where the runs kept their best checkpoint by it (monitor
    ``val/mAP``), else by mIoU."""
    if any(row.get("monitor") == "val/mAP" for row in table):
        return average_precision_markdown(table)
    return miou_markdown(table, budget_text)


def plot(table: list[dict[str, Any]], path: Path, title: str) -> None:
    """mIoU (mean, spread over seeds as error bars) against seconds per step; marker area ∝ peak memory."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [r for r in table if r["test_mIoU_mean"] is not None and r.get("step_seconds")]
    figure, axes = plt.subplots(figsize=(7.5, 5))
    peaks = [r.get("peak_bytes") or 0 for r in points]
    largest = max(peaks, default=0) or 1
    for row, peak in zip(points, peaks, strict=True):
        size = 60 + 540 * peak / largest
        axes.errorbar(
            row["step_seconds"],
            row["test_mIoU_mean"],
            yerr=row["test_mIoU_std"] or 0,
            fmt="none",
            ecolor="0.5",
            capsize=3,
            zorder=1,
        )
        axes.scatter(row["step_seconds"], row["test_mIoU_mean"], s=size, alpha=0.6, zorder=2)
        label = f"{row['variant']} ({format_bytes(peak)})" if peak else row["variant"]
        axes.annotate(
            label,
            (row["step_seconds"], row["test_mIoU_mean"]),
            fontsize=8,
            xytext=(6, 6),
            textcoords="offset points",
        )
    axes.set_xlabel("seconds per training step")
    axes.set_ylabel("test mIoU (%)")
    axes.set_title(title, fontsize=9)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def run(settings: AccuracySettings, device: torch.device, out_dir: Path) -> list[dict[str, Any]]:
    recipe = read_recipe(settings.experiment, settings.overrides)  # a bad override fails before training
    if settings.only == "costs":
        measure_costs(settings, recipe, device, out_dir)
        console.print(f"accuracy: costs in {out_dir / COSTS_FILE}; rerun without --only for the table")
        return []
    runs = finished_runs(settings, out_dir) if settings.only == "table" else train_all(settings, out_dir)
    write_csv(out_dir / "accuracy.csv", runs)
    failed = [r for r in runs if r["status"] != "ok"]
    progress(f"accuracy: {len(runs) - len(failed)} runs finished, {len(failed)} failed")
    if failed and (settings.only == "train" or len(failed) == len(runs)):  # no table to make
        raise runs_failed(failed)
    if settings.only == "train":
        return []
    costs = measure_costs(settings, recipe, device, out_dir)
    table = summarize(runs, costs, settings.variants)
    write_csv(out_dir / "accuracy_table.csv", table)
    budget_text = f"{settings.maxres_budget_gib:g} GiB" if settings.maxres_budget_gib else "not measured"
    text = markdown(table, budget_text)
    (out_dir / "accuracy.md").write_text(text)
    title = (
        f"{settings.experiment}: {recipe.model.label}, {len(settings.seeds)} seed(s); "
        f"step cost at batch {recipe.batch}, {recipe.crop}² crops; marker area ∝ peak memory"
    )
    plot(table, out_dir / "accuracy.png", title)
    plots = f"plot {out_dir / 'accuracy.png'}"
    if any(row["downsample"] > 1 for row in table):
        subtitle = f"{settings.experiment}: test AP of each arm's best checkpoint, mean over seeds"
        plot_resolution(table, out_dir / "resolution.png", subtitle, recipe.mean_classes)
        plots += f", {out_dir / 'resolution.png'}"
    caption = (
        f"experiment={settings.experiment}; test scores of each run's best checkpoint; s/step and peak "
        f"memory of one fp32 training step at each arm's batch and crop (fresh process for the peak)"
    )
    lines = text.split("\n\n")[0].splitlines()
    columns = [cell.strip() for cell in lines[0].strip().strip("|").split("|")]
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines[2:]]
    print_table("accuracy", columns, rows, caption)
    console.print(f"accuracy: table {out_dir / 'accuracy.md'}, {plots}")
    if failed:
        raise runs_failed(failed)
    return table


def runs_failed(failed: list[dict[str, Any]]) -> SegattnError:
    """The failed runs by name, with where their logs are: the command exits with 1 (``segattn.errors``)."""
    names = ", ".join(f"{Path(r['run_dir']).name} ({r['note']})" for r in failed)
    return SegattnError(f"{len(failed)} run(s) failed: {names}; rerun the command to retry")


__all__ = ["AccuracySettings", "default_variants", "parse_spec", "run"]
