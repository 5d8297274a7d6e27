"""python tools/accuracy_table.py RUNS [OUT]: the accuracy table of a ``train.py -m`` study, from its runs.

RUNS is the sweep folder of an accuracy experiment (conf/experiment/accuracy_*.yaml, idrid_*.yaml: their
``hydra.sweeper.params`` list the arms, conf/experiment/arms/<study>/<arm>.yaml, and the seeds), one folder
``<arm>-seed<seed>`` per run. Each run that tested its best checkpoint (``summary.json`` with test scores)
is a row of OUT/accuracy.csv; OUT/accuracy_table.csv and OUT/accuracy.md have one row per arm (mean and
spread over seeds, per-class means, and the costs of ``OUT/costs.json`` where it exists: s/step, peak
memory, largest image), OUT/accuracy.png plots mIoU against s/step and, where arms train at a shrink
(``data.downsample``), OUT/resolution.png plots AP against the scale. OUT defaults to RUNS' parent. Arms
are listed in the sweep's order (RUNS/multirun.yaml), else by name.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

from segattn.bench.report import format_bytes, format_seconds, print_table, write_csv

RUN_DIR = re.compile(r"^(?P<arm>.+)-seed(?P<seed>[0-9]+)$")


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """The finished run's summary (None while it has no test scores)."""
    path = run_dir / "summary.json"
    if not path.is_file():
        return None
    summary = json.loads(path.read_text())
    return summary if summary.get("test") else None


def run_config(run_dir: Path) -> dict[str, Any]:
    """What the table reads of a run's composed config (``.hydra/config.yaml``): its attention, its shrink
    and the classes its mAP averages (``metrics.ap_mean_classes``, the panels of the resolution plot)."""
    path = run_dir / ".hydra" / "config.yaml"
    cfg = yaml.safe_load(path.read_text()) if path.is_file() else {}
    return {
        "attention": (cfg.get("attention") or {}).get("name"),
        "downsample": int((cfg.get("data") or {}).get("downsample") or 1),
        "mean_classes": (cfg.get("metrics") or {}).get("ap_mean_classes"),
    }


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


def sweep_arms(runs_dir: Path) -> list[str]:
    """The arms in the order the sweep lists them (``+experiment/arms/<study>: a,b,...`` in multirun.yaml),
    empty without it."""
    path = runs_dir / "multirun.yaml"
    if not path.is_file():
        return []
    params = ((yaml.safe_load(path.read_text()).get("hydra") or {}).get("sweeper") or {}).get("params") or {}
    listed = next((value for key, value in params.items() if "experiment/arms/" in key), "")
    return [arm.strip() for arm in str(listed).split(",") if arm.strip()]


def finished_runs(runs_dir: Path) -> list[dict[str, Any]]:
    """A row per run with test scores, arm by arm in the sweep's order (``sweep_arms``, then by name),
    seeds ascending; runs without them are left out (still training, or failed)."""
    rows = []
    for run_dir in sorted(runs_dir.iterdir()):
        match = RUN_DIR.match(run_dir.name)
        summary = read_summary(run_dir) if match else None
        if summary is not None:
            rows.append({"variant": match["arm"], "seed": int(match["seed"]), "run_dir": str(run_dir)})
            rows[-1] |= run_config(run_dir) | finished_row(run_dir, summary)
            rows[-1]["mean_classes"] = " ".join(rows[-1]["mean_classes"] or [])
    order = {arm: index for index, arm in enumerate(sweep_arms(runs_dir))}
    rows.sort(key=lambda r: (order.get(r["variant"], len(order)), r["variant"]))
    return rows


def mean_or_none(values: list[float | None]) -> float | None:
    """The mean of the defined values (NaN and None left out), None without any."""
    kept = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.fmean(kept) if kept else None


def summarize(runs: list[dict[str, Any]], costs: dict[str, dict[str, Any]]) -> list[dict]:
    """One row per arm (in the order of ``runs``): mean and spread of test mIoU (and mAP, where scored) over
    seeds, the mean of each per-class column, and the costs."""
    table = []
    for arm in dict.fromkeys(r["variant"] for r in runs):
        mine = [r for r in runs if r["variant"] == arm and r["status"] == "ok"]
        scores = [r["test_mIoU"] for r in mine]
        row: dict[str, Any] = {"variant": arm, "seeds": len(scores)}
        row["attention"] = mine[0]["attention"] if mine else None
        row["downsample"] = mine[0]["downsample"] if mine else 1
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
        table.append(row | costs.get(arm, {}))
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


def class_columns(table: list[dict[str, Any]], prefix: str) -> list[str]:
    """Class names of the per-class ``<prefix><class>_mean`` columns, in first-seen order."""
    names: dict[str, None] = {}
    for row in table:
        names.update(dict.fromkeys(k[len(prefix) : -len("_mean")] for k in row if k.startswith(prefix)))
    return list(names)


def score_cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def average_precision_markdown(table: list[dict[str, Any]]) -> str:
    """Two tables for runs scored by average precision: test mAP (the mean over the classes the
    experiment averages, ``metrics.ap_mean_classes``) with each class's AP, mIoU and the costs; then each
    class's IoU. Per-class cells are means over seeds."""
    ap_classes, iou_classes = class_columns(table, "test_AP_"), class_columns(table, "test_IoU_")
    final = any(row.get("test_last_mAP_mean") is not None for row in table)  # runs with test_last=true
    lines = [
        "| arm | test mAP (mean ± std) | runs | "
        + ("final weights' mAP | " if final else "")
        + " | ".join(f"AP {name}" for name in ap_classes)
        + " | mIoU | s/step | peak memory / step | minutes / run |",
        "|---|---|---|" + "---|" * (len(ap_classes) + final) + "---|---|---|---|",
    ]
    for row in table:
        mean, std = row.get("test_mAP_mean"), row.get("test_mAP_std")
        score = "-" if mean is None else f"{mean:.2f}" + ("" if std is None else f" ± {std:.2f}")
        cells = [score_cell(row.get(f"test_AP_{name}_mean")) for name in ap_classes]
        step = format_seconds(row["step_seconds"]) if row.get("step_seconds") else "-"
        peak = format_bytes(row["peak_bytes"]) if row.get("peak_bytes") else "-"
        minutes = score_cell(row.get("train_minutes_mean"))
        if final:
            cells.insert(0, score_cell(row.get("test_last_mAP_mean")))
        lines.append(
            f"| `{row['variant']}` | {score} | {row.get('test_mAP_runs', '')} | {' | '.join(cells)} | "
            f"{score_cell(row['test_mIoU_mean'])} | {step} | {peak} | {minutes} |"
        )
    lines += ["", "| arm | " + " | ".join(f"IoU {name}" for name in iou_classes) + " |"]
    lines.append("|---|" + "---|" * len(iou_classes))
    for row in table:
        cells = [score_cell(row.get(f"test_IoU_{name}_mean")) for name in iou_classes]
        lines.append(f"| `{row['variant']}` | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def plot_resolution(
    table: list[dict[str, Any]], path: Path, title: str, classes: list[str] | None = None
) -> None:
    """One panel per class of ``classes`` (the experiment's ``metrics.ap_mean_classes``; default every
    per-class column) and one for the mean AP, against the scale the arm trains and predicts at (1 = full
    resolution, 1/f for ``data.downsample`` = f). Arms of one attention at several scales are joined by a
    line; other arms are single markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = classes or class_columns(table, "test_AP_")
    panels = [(f"test_AP_{name}_mean", f"AP {name} (%)") for name in names]
    panels.append(("test_mAP_mean", "test mAP (%)"))
    columns = min(3, len(panels))
    rows_count = -(-len(panels) // columns)
    figure, grid = plt.subplots(rows_count, columns, figsize=(4.8 * columns, 4 * rows_count), squeeze=False)
    axes = grid.ravel()
    for spare in axes[len(panels) :]:
        spare.set_visible(False)
    scaled = {row["attention"] for row in table if row["downsample"] > 1}  # these form lines
    series: dict[str, list[dict[str, Any]]] = {}
    for row in table:
        series.setdefault(row["attention"] if row["attention"] in scaled else row["variant"], []).append(row)
    for axis, (key, label) in zip(axes, panels, strict=False):
        for name, rows in series.items():
            points = sorted((1 / r["downsample"], r[key]) for r in rows if r.get(key) is not None)
            if points:
                xs, ys = zip(*points, strict=True)
                axis.plot(xs, ys, marker="o", linestyle="-" if len(points) > 1 else "none", label=name)
        axis.set_xscale("log", base=2)
        axis.set_xticks([1 / 8, 1 / 4, 1 / 2, 1], ["1/8", "1/4", "1/2", "1"])
        axis.set_xlabel("image scale (1 = full resolution)")
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
    axes[len(panels) - 1].legend(fontsize=8)
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def read_costs(out_dir: Path) -> tuple[dict[str, dict[str, Any]], str]:
    """Per arm, the step seconds, peak bytes and largest image of ``OUT/costs.json``, and the memory budget
    of the largest image ("not measured" without one)."""
    path = out_dir / "costs.json"
    if not path.is_file():
        return {}, "not measured"
    stored = json.loads(path.read_text())
    steps, maxres = stored.get("steps", {}), stored.get("maxres", {})
    budget = stored.get("settings", {}).get("maxres_budget_gib")
    costs = {arm: {**steps.get(arm, {}), **maxres.get(arm, {})} for arm in dict.fromkeys([*steps, *maxres])}
    return costs, f"{budget:g} GiB" if budget else "not measured"


def main(argv: list[str]) -> int:
    """Table the finished runs of RUNS into OUT; status 2 with one line when there is nothing to table."""
    if len(argv) not in (1, 2) or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    runs_dir = Path(argv[0])
    out_dir = Path(argv[1]) if len(argv) == 2 else runs_dir.parent
    runs = finished_runs(runs_dir) if runs_dir.is_dir() else []
    if not runs:
        print(f"accuracy_table: {runs_dir}: no <arm>-seed<seed> run with test scores", file=sys.stderr)
        return 2
    out_dir.mkdir(parents=True, exist_ok=True)
    write_csv(out_dir / "accuracy.csv", runs)
    costs, budget = read_costs(out_dir)
    table = summarize(runs, costs)
    write_csv(out_dir / "accuracy_table.csv", table)
    text = markdown(table, budget)
    (out_dir / "accuracy.md").write_text(text)
    plot(table, out_dir / "accuracy.png", f"{runs_dir}: marker area ∝ peak memory")
    if any(row["downsample"] > 1 for row in table):
        title = f"{runs_dir}: test AP of each arm's best checkpoint, mean over seeds"
        plot_resolution(table, out_dir / "resolution.png", title, runs[0]["mean_classes"].split() or None)
    lines = text.split("\n\n")[0].splitlines()
    columns = [cell.strip() for cell in lines[0].strip().strip("|").split("|")]
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines[2:]]
    print_table("accuracy", columns, rows, f"{len(runs)} run(s) of {runs_dir}; tables in {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
