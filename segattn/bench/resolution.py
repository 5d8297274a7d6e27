"""The tables and the plot of an accuracy experiment scored by average precision at several resolutions
(``bench accuracy --experiment idrid_cpu``): per-class AP and IoU per arm, and AP against image scale,
one line per attention."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .report import format_bytes, format_seconds


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
