"""``bench accuracy``: test mIoU against training cost for every attention variant, trained alike.

Every (variant, seed) is one ``train.py`` run of the same experiment (model, data, crop, epochs, schedule)
in its own directory ``<out>/runs/<variant>-seed<seed>``, which tests its best checkpoint on the test
split (``test_after_fit``). Runs are resumable: a finished run (its ``summary.json`` holds test scores) is
kept, an interrupted one continues from its ``last.ckpt``, so rerunning the same command completes the
table. The arms are an experiment's ``table`` (``arms``) or ``--variants``; the costs are measured after
training (``costs``); ``only="costs"`` measures them while another process trains, and ``only="table"``
tables the runs finished so far without training the rest (``accuracy_table``).
Results: ``accuracy.csv`` (one row per run), ``accuracy_table.csv`` / ``accuracy.md`` (one row per
variant) and ``accuracy.png`` (mIoU against time per step, marker area = peak memory).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import SegattnError
from .accuracy_table import markdown, plot, summarize
from .arms import spec_overrides
from .costs import COSTS_FILE, measure_costs, read_recipe
from .report import console, print_table, progress, write_csv
from .resolution import plot_resolution
from .specs import Spec

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


__all__ = ["AccuracySettings", "run"]
