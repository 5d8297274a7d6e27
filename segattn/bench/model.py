"""``bench model``: one full training step (forward, loss, backward, AdamW step) per model and variant.

A variant spec's options go to the attention when it accepts them and to the model family otherwise, so
``softmax:sr_ratios=[1,1,1,1]`` is PVT with softmax and no spatial reduction. Steps of all variants at one
image size are timed round-robin; peak memory (weights, optimizer state and activations) comes from a
fresh child per (model, variant).
"""

from __future__ import annotations

import functools
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ..attention import attention_class, attention_options
from ..cpu_memory import return_freed_memory
from .measure import (
    Emit,
    PeakMemory,
    autocast_for,
    fill_peaks,
    is_out_of_memory,
    synchronize,
    time_call,
)
from .op import DTYPES
from .report import Panel, grid, plot_panels, print_table, progress, write_csv
from .specs import Spec, compile_options, parse_spec, with_compiled

NUM_CLASSES = 19
NO_REDUCTION = "softmax:sr_ratios=[1,1,1,1]"


@dataclass
class ModelSettings:
    models: list[Spec]
    variants: list[Spec] | None  # None: each model's default_variants
    image_sizes: list[int]
    dtypes: list[str]
    batch: int = 1
    repeats: int = 3
    max_step_seconds: float = 300.0
    clock: str = "wall"
    memory: bool = True
    memory_timeout: float = 3600.0
    compile: bool = False  # also each variant's compiled twin


def default_models(smoke: bool) -> list[str]:
    return (
        ["pvt:size=b0", "vit:size=tiny"]
        if smoke
        else ["pvt:size=b0", "vit:size=small", "efficientvit:size=b0"]
    )


def default_variants(smoke: bool, model: str = "pvt") -> list[str]:
    """softmax first (the reference of the speed-up column), then the linear variants."""
    if smoke:
        return ["softmax", "flatten"]
    reference = [NO_REDUCTION, "softmax"] if model == "pvt" else ["softmax"]
    return [*reference, "efficient", "linear", "taylor", "flatten", "agent", "pola", "litemla"]


def build_kwargs(model: Spec, variant: Spec) -> dict[str, Any]:
    """``build_model`` kwargs: the variant's options split between the attention and the model family."""
    accepted = set(attention_options(variant.name))
    attention = {key: value for key, value in variant.options.items() if key in accepted}
    family = {key: value for key, value in variant.options.items() if key not in accepted}
    kwargs = {"name": model.name, "num_classes": NUM_CLASSES, "attention": variant.name}
    return kwargs | {"attention_options": attention, **model.options, **family}


class TrainStep:
    """A model, its AdamW optimizer and one random batch; calling it runs one training step (with the
    network compiled in place when ``compiled``; its first steps compile)."""

    def __init__(
        self,
        kwargs: dict[str, Any],
        size: int,
        batch: int,
        dtype: str,
        device: torch.device,
        checkpointing: bool = False,
        compiled: bool = False,
    ) -> None:
        from ..models import build_model

        self.device, self.dtype = device, DTYPES[dtype]
        self.model = build_model(**kwargs).to(device).train()
        self.model.set_grad_checkpointing(checkpointing)
        if compiled:
            self.model.compile(**compile_options())
        self.optimizer = torch.optim.AdamW(self.model.param_groups(lr=1e-4, weight_decay=0.01))
        self.images = torch.randn(batch, 3, size, size, device=device)
        self.masks = torch.randint(0, NUM_CLASSES, (batch, size, size), device=device)

    def __call__(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        with autocast_for(self.device, self.dtype):
            logits, aux = self.model.forward_with_aux(self.images)
        loss = F.cross_entropy(logits.float(), self.masks)
        if aux is not None:
            loss = loss + self.model.aux_weight * F.cross_entropy(aux.float(), self.masks)
        loss.backward()
        self.optimizer.step()


def variants_for(settings: ModelSettings, model: Spec) -> list[Spec]:
    specs = settings.variants
    if specs is None:
        specs = [parse_spec(text) for text in default_variants(False, model.name)]
    return with_compiled(specs, settings.compile)


def time_steps(settings: ModelSettings, device: torch.device) -> list[dict[str, Any]]:
    """Median step time per (model, variant, dtype, size); variants of one size timed round-robin."""
    rows: list[dict[str, Any]] = []
    for model in settings.models:
        variants = variants_for(settings, model)
        for dtype in settings.dtypes:
            history: dict[str, tuple[int, float]] = {}
            failed: dict[str, str] = {}
            for size in sorted(settings.image_sizes):
                base = {"model": model.label, "dtype": dtype, "size": size, "batch": settings.batch}
                steps: dict[str, TrainStep] = {}
                for variant in variants:
                    reason = predicted_too_slow(variant, size, history, settings)
                    if variant.label in failed:
                        reason = f"skipped: {failed[variant.label]}"
                    if reason:
                        rows.append({**base, "variant": variant.label, "status": "skipped", "note": reason})
                        continue
                    try:
                        kwargs = build_kwargs(model, variant)
                        steps[variant.label] = TrainStep(
                            kwargs, size, settings.batch, dtype, device, compiled=variant.compiled
                        )
                    except (ValueError, TypeError) as error:
                        failed[variant.label] = f"error: {error}"
                        rows.append({**base, "variant": variant.label, "status": "error", "note": str(error)})
                progress(f"model {model.label} {dtype} {size}²: {', '.join(steps) or 'nothing to time'}")
                samples = round_robin(steps, device, settings, failed)
                for label, times in samples.items():
                    if label in failed:
                        rows.append({**base, "variant": label, "status": failed[label].split(":")[0]})
                        rows[-1]["note"] = failed[label]
                        continue
                    seconds = statistics.median(times)
                    history[label] = (size, seconds)
                    rows.append(
                        {**base, "variant": label, "seconds": seconds, "repeats": len(times)}
                        | {"images_per_s": settings.batch / seconds, "status": "ok", "note": ""}
                    )
                del steps
        add_speedups(rows, model.label, variants[0].label)
    return rows


def predicted_too_slow(
    variant: Spec, size: int, history: dict[str, tuple[int, float]], settings: ModelSettings
) -> str | None:
    if variant.label not in history:
        return None
    last_size, seconds = history[variant.label]
    exponent = 4 if attention_class(variant.name).quadratic else 2  # cost in pixels² (N²) or pixels (N)
    predicted = seconds * (size / last_size) ** exponent
    if predicted > settings.max_step_seconds:
        return f"skipped: ~{predicted:.0f} s/step predicted > {settings.max_step_seconds:g} s"
    return None


def round_robin(
    steps: dict[str, TrainStep], device: torch.device, settings: ModelSettings, failed: dict[str, str]
) -> dict[str, list[float]]:
    """Warm-up steps (two with ``compile``: the first compiles), then ``repeats`` timed rounds of one step
    per variant."""
    warmup = 2 if settings.compile else 1
    samples: dict[str, list[float]] = {label: [] for label in steps}
    for round_ in range(warmup + settings.repeats):
        for label, step in steps.items():
            if label in failed:
                continue
            try:
                seconds = time_call(step, device, settings.clock)
            except RuntimeError as error:
                failed[label] = f"{'oom' if is_out_of_memory(error) else 'error'}: {str(error)[:200]}"
                synchronize(device)
                continue
            if round_ >= warmup:
                samples[label].append(seconds)
    return samples


def add_speedups(rows: list[dict[str, Any]], model: str, reference: str) -> None:
    """``speedup`` = step time of the ``reference`` variant / this variant's (same model, size, dtype)."""
    mine = [row for row in rows if row["model"] == model and row["status"] == "ok"]
    times = {(row["dtype"], row["size"]): row["seconds"] for row in mine if row["variant"] == reference}
    for row in mine:
        if (row["dtype"], row["size"]) in times:
            row["speedup"] = times[row["dtype"], row["size"]] / row["seconds"]


def memory_child(task: dict[str, Any], emit: Emit) -> None:
    """Child process: peak memory of one training step per size (fresh model and optimizer each; a compiled
    variant compiles on a throwaway step first, so the compiler's own memory stays out of the peak)."""
    return_freed_memory()
    device = torch.device(task["device"])
    make = functools.partial(TrainStep, task["kwargs"], batch=task["batch"], dtype=task["dtype"])
    make = functools.partial(make, device=device, compiled=task["compiled"])
    for size in task["sizes"]:
        if task["compiled"]:
            make(size)()
        with PeakMemory(device) as peak:
            step = make(size)
            step()
            del step
        emit({"size": size, "peak_bytes": peak.peak})


def measure_memory(rows: list[dict[str, Any]], settings: ModelSettings, device: torch.device) -> None:
    for model in settings.models:
        for variant in variants_for(settings, model):
            for dtype in settings.dtypes:
                key = (model.label, variant.label, dtype)
                mine = [
                    r for r in rows if (r["model"], r["variant"], r["dtype"]) == key and r["status"] == "ok"
                ]
                if not mine:
                    continue
                task = {"kwargs": build_kwargs(model, variant), "sizes": [r["size"] for r in mine]}
                task |= {"compiled": variant.compiled}
                task |= {"batch": settings.batch, "dtype": dtype, "device": str(device)}
                fill_peaks(mine, "size", memory_child, task, settings.memory_timeout)


def measured_lines(row: dict[str, Any]) -> list[str]:
    lines = [f"{row['images_per_s']:.3g} img/s", f"{row['seconds']:.3g} s/step"]
    if "speedup" in row:
        lines.append(f"{row['speedup']:.3g}× first")
    return lines


def report(rows: list[dict[str, Any]], settings: ModelSettings, out_dir: Path) -> None:
    """One table per (model, dtype); model.csv; model.png (images/s and peak memory against image size)."""
    write_csv(out_dir / "model.csv", rows)
    sizes = sorted(settings.image_sizes)
    panels = []
    for model in settings.models:
        labels = [variant.label for variant in variants_for(settings, model)]
        for dtype in settings.dtypes:
            mine = {
                (r["variant"], r["size"]): r for r in rows if (r["model"], r["dtype"]) == (model.label, dtype)
            }
            table = grid(labels, sizes, mine, measured_lines)
            caption = (
                f"one training step (forward, cross-entropy, backward, AdamW) at batch {settings.batch}; "
                f"speed-up relative to the first variant ({labels[0]}); peak = weights + optimizer state + "
                "activations, fresh process"
            )
            print_table(
                f"model {model.label}, {dtype}", ["variant"] + [f"{s}²" for s in sizes], table, caption
            )
            speed = Panel(f"{model.label}, {dtype}", "image side (pixels)", "images / s")
            memory = Panel(f"{model.label}, {dtype}", "image side (pixels)", "peak bytes")
            for row in mine.values():
                if row["status"] == "ok":
                    speed.add(row["variant"], row["size"], row["images_per_s"])
                    if row.get("peak_bytes"):
                        memory.add(row["variant"], row["size"], row["peak_bytes"])
            panels += [speed, memory] if settings.memory else [speed]
    plot_panels(out_dir / "model.png", panels, columns=2 if settings.memory else 1)


def run(settings: ModelSettings, device: torch.device, out_dir: Path) -> list[dict[str, Any]]:
    rows = time_steps(settings, device)
    if settings.memory:
        measure_memory(rows, settings, device)
    report(rows, settings, out_dir)
    return rows
