"""What an evaluation leaves behind: the printed tables, metrics.json, per_class.csv, confusion.png and
examples.png. Inputs are plain scores (from ``SegmentationMetric``), never the model or the data."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from ..files import atomic_write_text
from .metrics import PER_CLASS_KEYS as IOU_PER_CLASS_KEYS
from .metrics import SUMMARY_KEYS as IOU_SUMMARY_KEYS

SUMMARY_KEYS = (*IOU_SUMMARY_KEYS, "mAP")  # mAP: AveragePrecisionMetric's mean over metrics.ap_mean_classes
PER_CLASS_KEYS = (*IOU_PER_CLASS_KEYS, "AP")


def finite_or_none(value: float) -> float | None:
    """NaN (an undefined score) as None, so JSON stays standard."""
    return None if value is None or math.isnan(value) else float(value)


def scores_record(scores: dict[str, Any], confusion: np.ndarray, classes: list[str]) -> dict[str, Any]:
    """Summary scores and per-class scores (plus label pixel counts) as plain, JSON-ready values; the
    average-precision keys only where ``scores`` has them."""
    summary_keys = [key for key in SUMMARY_KEYS if key in scores]
    per_class_keys = [key for key in PER_CLASS_KEYS if key in scores]
    return {
        "summary": {key: finite_or_none(float(scores[key])) for key in summary_keys},
        "per_class": {
            name: {key: finite_or_none(float(scores[key][index])) for key in per_class_keys}
            | {"pixels": int(confusion[index].sum())}
            for index, name in enumerate(classes)
        },
    }


def print_scores(record: dict[str, Any], title: str, console: Console | None = None) -> None:
    """The mmseg-style per-class table (IoU, Acc, Dice, Precision, Recall, AP) and the summary line."""
    per_class_keys = list(next(iter(record["per_class"].values()), {}))[:-1]  # all but "pixels"
    table = Table(title=title, title_justify="left")
    table.add_column("class")
    for key in per_class_keys:
        table.add_column(key, justify="right")
    for name, values in record["per_class"].items():
        table.add_row(name, *(_cell(values[key]) for key in per_class_keys))
    summary = Table(show_header=True)
    for key in record["summary"]:
        summary.add_column(key, justify="right")
    summary.add_row(*(_cell(value) for value in record["summary"].values()))
    console = console or Console()
    console.print(table)
    console.print(summary)


def write_per_class_csv(record: dict[str, Any], path: Path) -> None:
    text = io.StringIO(newline="")
    writer = csv.writer(text)
    per_class_keys = list(next(iter(record["per_class"].values()), {}))[:-1]  # all but "pixels"
    writer.writerow(["class", *per_class_keys, "pixels"])
    for name, values in record["per_class"].items():
        row = [_csv_cell(values[key]) for key in per_class_keys]
        writer.writerow([name, *row, values["pixels"]])
    atomic_write_text(path, text.getvalue())


def plot_confusion(confusion: np.ndarray, classes: list[str], path: Path, title: str) -> None:
    """Row-normalised confusion matrix (each row: where that class's pixels went), class names on the axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = confusion.astype(np.float64)
    totals = counts.sum(axis=1, keepdims=True)
    rates = np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)
    side = max(4.0, 0.45 * len(classes) + 2)
    figure, axes = plt.subplots(figsize=(side + 1, side))
    image = axes.imshow(rates, cmap="Blues", vmin=0, vmax=1)
    ticks = np.arange(len(classes))
    axes.set_xticks(ticks, classes, rotation=60, ha="right", fontsize=8)
    axes.set_yticks(ticks, classes, fontsize=8)
    axes.set_xlabel("predicted class")
    axes.set_ylabel("true class")
    axes.set_title(title, fontsize=9)
    if len(classes) <= 30:
        for row, col in np.ndindex(rates.shape):
            if rates[row, col] >= 0.005:
                colour = "white" if rates[row, col] > 0.5 else "black"
                axes.text(
                    col, row, f"{rates[row, col]:.2f}", ha="center", va="center", fontsize=6, color=colour
                )
    figure.colorbar(image, ax=axes, fraction=0.046, pad=0.04, label="fraction of the true class's pixels")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_examples(examples: list[dict[str, Any]], palette: list[tuple[int, int, int]], path: Path) -> None:
    """One row per example: image | ground truth | prediction, labels in the class palette (ignore: black)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = np.zeros((256, 3), dtype=np.uint8)
    colours[: len(palette)] = np.asarray(palette, dtype=np.uint8)[:256]
    figure, axes = plt.subplots(len(examples), 3, figsize=(10, 3 * len(examples)), squeeze=False)
    for row, example in zip(axes, examples, strict=True):
        panels = [example["rgb"], colours[example["mask"].clip(0, 255)], colours[example["pred"]]]
        for axis, panel, name in zip(row, panels, ("image", "ground truth", "prediction"), strict=True):
            axis.imshow(panel)
            axis.set_title(f"{name}: {example['name']}" if name == "image" else name, fontsize=8)
            axis.axis("off")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _csv_cell(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"
