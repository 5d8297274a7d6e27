"""``bench maxres``: the largest square image that trains at batch 1 within a memory budget.

Each probe is two training steps (as in ``bench model``) in a fresh child whose allocations are capped a
little above the budget, so an oversized probe fails with an allocation error rather than starving the
machine. A probe fits when it finishes with its peak memory (weights, optimizer state, activations) within the
budget. Sizes double from ``start`` until a probe fails, then bisect on multiples of ``step``. A linear fit of
the fitting probes' peaks (bytes = a + b·pixels) extrapolates the maxres to a budget larger than this machine
has (``extrapolate_gib``). Variants run eager and, with ``compile=true``, compiled, on each kernel path of
``kernels``, labelled as in ``bench model``; ``peak_bytes_per_mpx`` is the largest fitting probe's peak per
megapixel.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..cpu_memory import reuse_freed_memory
from .bands import band_probe_child
from .measure import Emit, PeakMemory, guard_memory, run_isolated, time_call, total_memory_budget
from .model import TrainStep, build_kwargs
from .report import Panel, format_bytes, plot_panels, print_table, progress, write_csv
from .specs import Spec, with_compiled, with_kernels

PROBE_STEPS = 2  # a training process's heap grows over its first steps (most with reused memory)


@dataclass
class MaxresSettings:
    models: list[Spec]
    variants: list[Spec]
    budget_bytes: int | None  # None: 80% of free RAM / GPU memory
    checkpointing: list[bool]
    start: int = 512
    step: int = 128
    max_size: int = 8192
    probe_timeout: float = 900.0
    dtype: str = "fp32"
    extrapolate_gib: float | None = 24.0
    bands: list[int] = field(default_factory=lambda: [1])  # P > 1: one image split over P processes
    compile: bool = False  # also each variant's compiled twin (one process only)
    kernels: list[str] = field(default_factory=lambda: ["auto"])  # SEGATTN_KERNEL values, side by side

    @property
    def rows(self) -> list[Spec]:
        """The variants as labelled rows: eager and compiled, per kernel path."""
        return with_kernels(with_compiled(self.variants, self.compile), self.kernels)


def probe_child(task: dict[str, Any], emit: Emit) -> None:
    """Child process: training steps at ``task['size']`` under a memory guard; emits the peak and the last
    step's time. The allocator is set as a training run in this environment sets it, so the peak is
    training's."""
    reuse_freed_memory()
    device = torch.device(task["device"])
    guard_memory(device, task["guard"])
    args = (task["kwargs"], task["size"], 1, task["dtype"], device, task["checkpointing"])
    if task["compiled"]:  # the compiler's own work and memory stay out of the peak
        TrainStep(*args, compiled=True, kernel=task["kernel"])()
    with PeakMemory(device) as peak:
        step = TrainStep(*args, compiled=task["compiled"], kernel=task["kernel"])
        seconds = [time_call(step, device) for _ in range(PROBE_STEPS)][-1]
        del step
    emit({"status": "ok", "peak_bytes": peak.peak, "seconds": seconds})


def search(fits: Callable[[int], bool], start: int, step: int, max_size: int) -> int:
    """Largest multiple of ``step`` ≤ ``max_size`` for which ``fits`` holds (0 if none), assuming that
    whatever fits at a size also fits at every smaller one: double from ``start``, then bisect."""
    max_size = max_size // step * step
    good, size = 0, min(max(step, start // step * step), max_size)
    while fits(size):
        good = size
        if size >= max_size:
            return good
        size = min(2 * size, max_size)
    bad = size
    while good == 0:
        size = bad // 2 // step * step
        if size < step:
            return 0
        if fits(size):
            good = size
        else:
            bad = size
    while bad - good > step:
        middle = (good + bad) // 2 // step * step
        if fits(middle):
            good = middle
        else:
            bad = middle
    return good


def probe(task: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run one probe child and classify it: fits, over budget, oom, timeout, error or killed."""
    if task["bands"] > 1:  # the child starts the band processes
        messages, ending = run_isolated(band_probe_child, task, timeout, daemon=False)
    else:
        messages, ending = run_isolated(probe_child, task, timeout)
    result = messages[-1] if messages else {"status": ending}
    row = {"size": task["size"], "checkpointing": task["checkpointing"], "bands": task["bands"]}
    row |= {"status": result["status"], "traffic_bytes": result.get("traffic")}
    row |= {
        "peak_bytes": result.get("peak_bytes"),
        "seconds": result.get("seconds"),
        "note": result.get("error", ""),
    }
    if row["status"] == "ok" and row["peak_bytes"] > task["budget"]:
        row["status"] = "over budget"
    row["fits"] = row["status"] == "ok"
    if row["peak_bytes"]:
        row["peak_bytes_per_mpx"] = row["peak_bytes"] / (task["size"] ** 2 / 1e6)
    return row


def extrapolate(history: list[dict[str, Any]], budget: int, step: int) -> int | None:
    """Size at which the least-squares line bytes = a + b·size² through the fitting probes hits ``budget``."""
    points = [(row["size"] ** 2, row["peak_bytes"]) for row in history if row["fits"]]
    if len({pixels for pixels, _ in points}) < 2:
        return None
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points)
    if slope <= 0:
        return None
    pixels = (budget - (mean_y - slope * mean_x)) / slope
    return int(math.sqrt(pixels)) // step * step if pixels > 0 else 0


def find_maxres(
    model: Spec,
    variant: Spec,
    checkpointing: bool,
    bands: int,
    settings: MaxresSettings,
    budget: int,
    device: torch.device,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Bisect one (model, variant, checkpointing, bands); returns its result row and the probe history. The
    budget is per process; each of ``bands`` processes is guarded at its share of what is free."""
    task = {"kwargs": build_kwargs(model, variant), "device": str(device), "budget": budget}
    task |= {"compiled": variant.compiled, "kernel": variant.kernel}
    task["guard"] = min(
        budget, total_memory_budget(device, fraction=0.9) // bands
    )  # never beyond what is free
    task |= {"dtype": settings.dtype, "checkpointing": checkpointing, "bands": bands}
    task |= {"threads": torch.get_num_threads(), "steps": PROBE_STEPS}
    history: list[dict[str, Any]] = []

    def fits(size: int) -> bool:
        history.append(probe({**task, "size": size}, settings.probe_timeout))
        peak = format_bytes(history[-1]["peak_bytes"]) if history[-1]["peak_bytes"] else "-"
        name = f"{model.label} {variant.label}{' ckpt' if checkpointing else ''}"
        name += f" ×{bands} bands" if bands > 1 else ""
        progress(f"maxres {name}: {size}² {history[-1]['status']}, peak {peak}")
        return history[-1]["fits"]

    best = search(fits, settings.start, settings.step, settings.max_size)
    failures = sorted((r for r in history if not r["fits"]), key=lambda r: r["size"])
    row = {"model": model.label, "variant": variant.label, "checkpointing": checkpointing, "bands": bands}
    row["maxres"] = best
    fitting = [r for r in history if r["fits"]]
    largest = max(fitting, key=lambda r: r["size"]) if fitting else None
    row["traffic_bytes_per_step"] = largest["traffic_bytes"] if largest else None
    row["peak_bytes_per_mpx"] = largest["peak_bytes_per_mpx"] if largest else None
    row |= {"limited_by": failures[0]["status"] if failures else "max size", "budget_bytes": budget}
    row["probes"] = len(history)
    if settings.extrapolate_gib:
        target = int(settings.extrapolate_gib * (1 << 30))
        row[f"extrapolated_{settings.extrapolate_gib:g}gib"] = extrapolate(history, target, settings.step)
    return row, [{"model": model.label, "variant": variant.label} | r for r in history]


def run(settings: MaxresSettings, device: torch.device, out_dir: Path) -> list[dict[str, Any]]:
    budget = settings.budget_bytes or total_memory_budget(device)
    if budget > total_memory_budget(device, fraction=0.9):
        progress(
            f"maxres: budget {format_bytes(budget)} > 90% of the memory free now; probes are capped there, "
            "so larger sizes report 'oom' (this machine's limit); the extrapolation covers the budget"
        )
    rows: list[dict[str, Any]] = []
    probes: list[dict[str, Any]] = []
    for model in settings.models:
        for variant in settings.rows:
            for checkpointing in settings.checkpointing:
                for bands in settings.bands:
                    if bands > 1 and variant.compiled:  # the band processes train the eager model
                        row = {"model": model.label, "variant": variant.label, "checkpointing": checkpointing}
                        rows.append(
                            row | {"bands": bands, "maxres": None, "limited_by": "not run", "probes": 0}
                        )
                        continue
                    row, history = find_maxres(model, variant, checkpointing, bands, settings, budget, device)
                    rows.append(row)
                    probes += history
                    write_csv(out_dir / "maxres.csv", rows)  # a run cut short keeps the rows it finished
    report(rows, probes, settings, budget, out_dir)
    return rows


def report(
    rows: list[dict[str, Any]],
    probes: list[dict[str, Any]],
    settings: MaxresSettings,
    budget: int,
    out_dir: Path,
) -> None:
    write_csv(out_dir / "maxres.csv", rows)
    write_csv(out_dir / "maxres_probes.csv", probes)
    extra = f"extrapolated_{settings.extrapolate_gib:g}gib" if settings.extrapolate_gib else None
    columns = [f"{m.label}{', ckpt' if c else ''}" for m in settings.models for c in settings.checkpointing]
    table = []
    for variant, bands in ((v, b) for v in settings.rows for b in settings.bands):
        line = [variant.label + (f", {bands} bands" if bands > 1 else "")]
        for model in settings.models:
            for checkpointing in settings.checkpointing:
                row = next(
                    r
                    for r in rows
                    if (r["model"], r["variant"], r["checkpointing"], r["bands"])
                    == (model.label, variant.label, checkpointing, bands)
                )
                if row["maxres"] is None:
                    line.append("not run: bands train the eager model")
                    continue
                text = f"{row['maxres']}² ({row['limited_by']}, {row['probes']} probes)"
                if row["peak_bytes_per_mpx"]:
                    text += f"\n{format_bytes(row['peak_bytes_per_mpx'])}/MP at {row['maxres']}²"
                if extra and row.get(extra) is not None:
                    text += f"\n≈{row[extra]}² at {settings.extrapolate_gib:g} GiB"
                line.append(text)
        table.append(line)
    caption = (
        f"largest square image training at batch 1 ({settings.dtype}) within {format_bytes(budget)}, "
        f"bisection on multiples of {settings.step} up to {settings.max_size}; '≈' lines extrapolate the "
        "probes' peaks linearly in pixels; with bands, peaks are the largest process's and the budget is per "
        "process; /MP = the largest fitting probe's peak per megapixel. Probe history: maxres_probes.csv"
    )
    print_table("maxres", ["variant", *columns], table, caption)
    panels = []
    for model in settings.models:
        panel = Panel(f"maxres probes, {model.label}", "image side (pixels)", "peak bytes", hline=budget)
        for r in probes:
            if r["model"] == model.label and r["peak_bytes"]:
                label = f"{r['variant']}{', ckpt' if r['checkpointing'] else ''}"
                label += f", {r['bands']} bands" if r["bands"] > 1 else ""
                panel.add(label, r["size"], r["peak_bytes"])
                if r["checkpointing"]:
                    panel.dashed.add(label)
        panels.append(panel)
    plot_panels(out_dir / "maxres.png", panels)
