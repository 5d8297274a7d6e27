"""Output of the bench: rich tables on the terminal, CSV rows, log-log PNG plots and the machine header."""

from __future__ import annotations

import csv
import datetime
import io
import json
import platform
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from ..cpu_memory import reuse_requested
from ..files import atomic_write_text

# Tables stay readable when the output goes to a file or CI log instead of a terminal.
console = Console() if sys.stdout.isatty() else Console(width=160)


def progress(text: str) -> None:
    """One dim line while a part runs (the tables come at the end)."""
    console.print(f"[dim]{text}[/]")


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def environment(device: torch.device) -> dict[str, Any]:
    """What the numbers were measured on: device, threads, versions, commit and time."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {
        "device": device_name(device),
        "device_type": device.type,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "commit": commit,
        "reuse_freed_memory": reuse_requested(),
        "time": datetime.datetime.now().isoformat(timespec="seconds"),
    }


def write_environment(out_dir: Path, env: dict[str, Any]) -> None:
    atomic_write_text(out_dir / "environment.json", json.dumps(env, indent=2) + "\n")
    console.print("[bold]machine:[/] " + ", ".join(f"{key}={value}" for key, value in env.items()))


def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """One row per dict; the columns are the union of the keys in first-seen order."""
    columns: dict[str, None] = {}
    for row in rows:
        columns.update(dict.fromkeys(row))
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=list(columns))
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, text.getvalue())


def grid(
    labels: Sequence[str],
    columns: Sequence[Any],
    rows: dict[tuple[str, Any], dict[str, Any]],
    measured: Callable[[dict[str, Any]], list[str]],
) -> list[list[str]]:
    """Table rows: one per label, one ``cell_text`` per column, "–" where nothing was run."""
    return [
        [label] + [cell_text(rows[label, c], measured) if (label, c) in rows else "–" for c in columns]
        for label in labels
    ]


def cell_text(row: dict[str, Any], measured: Callable[[dict[str, Any]], list[str]]) -> str:
    """A table cell: the reason a configuration did not run, or its ``measured`` lines and peak memory."""
    if row["status"] != "ok":
        return row["note"].replace(": ", ":\n", 1)
    lines = measured(row)
    if "peak_bytes" in row:
        lines.append(format_bytes(row["peak_bytes"]))
    return "\n".join(lines)


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]], caption: str = "") -> None:
    table = Table(title=title, caption=caption or None, caption_justify="left", show_lines=True)
    for index, column in enumerate(columns):
        table.add_column(column, justify="left" if index == 0 else "right")
    for row in rows:
        table.add_row(*row)
    console.print(table)


@dataclass
class Panel:
    """One log-log axes: ``series[label] = [(x, y), ...]``; labels in ``dashed`` draw as dashed lines."""

    title: str
    xlabel: str
    ylabel: str
    series: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    dashed: set[str] = field(default_factory=set)
    hline: float | None = None

    def add(self, label: str, x: float, y: float) -> None:
        self.series.setdefault(label, []).append((x, y))


def plot_panels(path: Path, panels: Sequence[Panel], columns: int = 2, dpi: int = 90) -> None:
    """Log-log plot of every panel side by side, one line per series; saved as PNG (Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(columns, len(panels))
    rows = -(-len(panels) // columns)
    labels = list(dict.fromkeys(label for panel in panels for label in panel.series))
    references = [label for label in labels if any(label in panel.dashed for panel in panels)]
    measured = [label for label in labels if label not in references]
    colors = {label: f"C{index % 10}" for index, label in enumerate(measured)}  # one colour per series
    colors |= {label: ("black", "dimgray", "darkgray")[index % 3] for index, label in enumerate(references)}
    figure, axes = plt.subplots(
        rows, columns, figsize=(4.6 * columns + 1.8, 3.4 * rows), squeeze=False, layout="constrained"
    )
    for ax, panel in zip(axes.flat, panels, strict=False):
        for label, points in panel.series.items():
            xs, ys = zip(*sorted(points), strict=True)
            style = "--" if label in panel.dashed else "-o"
            ax.plot(xs, ys, style, color=colors[label], label=label, markersize=3, linewidth=1.2)
        if panel.hline is not None:
            ax.axhline(panel.hline, color="grey", linestyle=":", linewidth=1)
        ax.set(xscale="log", yscale="log", title=panel.title, xlabel=panel.xlabel, ylabel=panel.ylabel)
        ax.grid(True, which="both", linewidth=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    handles = {}
    for ax in axes.flat:
        handles.update(zip(*reversed(ax.get_legend_handles_labels()), strict=True))
    figure.legend(list(handles.values()), list(handles), loc="outside right upper", fontsize=8)
    figure.savefig(path, dpi=dpi)
    plt.close(figure)


def format_seconds(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} µs"


def format_bytes(count: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return f"{count / size:.3g} {unit}"
    return f"{int(count)} B"
