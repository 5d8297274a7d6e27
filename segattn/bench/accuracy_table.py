"""The table of ``bench accuracy``, made from finished runs and measured costs without training: one row per
arm (mean and spread of the test scores over seeds, per-class means, costs), the README table (by average
precision where the runs were kept by it, else by mIoU) and mIoU against the cost of a training step."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from .report import format_bytes, format_seconds
from .resolution import average_precision_markdown
from .specs import Spec


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
