"""``bench model``: one full training step (forward, the training module's loss, backward, AdamW step) per
model and variant.

A variant's options go to the attention when it accepts them, else to the model family: ``{name: softmax,
sr_ratios: [1,1,1,1]}`` is PVT with softmax and no spatial reduction. Each variant runs eager and, with
``compile=true``, compiled (``linear+compile``), on each kernel path of ``kernels`` (SEGATTN_KERNEL while the
model is built: ``linear@torch``, ``linear@triton``). Images are square (``2048``) or WIDTHxHEIGHT
(``4288x2848``), at each batch of ``batch``. The rows of one size and batch are timed round-robin after
warm-up rounds that include compilation; peak memory (weights, optimizer state, activations; also per
megapixel of the batch) comes from a fresh child per (model, variant). With ``profile``, one more step of each
timed row (at ``profile_size`` only, when set) runs under ``torch.profiler``: model_profile.csv.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from omegaconf import open_dict

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
from .profile import self_times
from .report import Panel, format_bytes, grid, plot_panels, print_table, progress, write_csv
from .specs import (
    Spec,
    compile_options,
    format_image_size,
    kernel_path,
    parse_image_size,
    size_label,
    spec_of,
    with_compiled,
    with_kernels,
)

if TYPE_CHECKING:
    from ..training.module import SegmentationModule

NUM_CLASSES = 19
NO_REDUCTION = {"name": "softmax", "sr_ratios": [1, 1, 1, 1]}  # PVT with softmax, no key reduction
Size = int | str | tuple[int, int]  # 2048, "4288x2848" (width x height) or (height, width)


@dataclass
class ModelSettings:
    models: list[Spec]
    variants: list[Spec] | None  # None: each model's default_variants
    image_sizes: list[Size]
    dtypes: list[str]
    batch: int | list[int] = 1  # several: one row per batch
    repeats: int = 5
    max_step_seconds: float = 300.0
    clock: str = "wall"
    memory: bool = True
    memory_timeout: float = 3600.0
    compile: bool = False  # also each variant's compiled twin
    kernels: list[str] = field(default_factory=lambda: ["auto"])  # SEGATTN_KERNEL values, side by side
    time_budget: float | None = None  # seconds: sizes not started by then are skipped (and say so)
    profile: bool = False  # one more step per timed row under torch.profiler: self time per kernel or op
    profile_size: tuple[int, int] | None = None  # (height, width) profiled; None: every size

    @property
    def batches(self) -> list[int]:
        return [self.batch] if isinstance(self.batch, int) else list(self.batch)

    @property
    def shapes(self) -> list[tuple[int, int]]:
        """(height, width) of every image size, fewest pixels first."""
        return sorted(
            (parse_image_size(s) if not isinstance(s, tuple) else s for s in self.image_sizes),
            key=lambda hw: (hw[0] * hw[1], hw),
        )


def default_variants(model: str) -> list[Spec]:
    """softmax first (the reference of the speed-up column), then the linear variants."""
    reference = [NO_REDUCTION, "softmax"] if model == "pvt" else ["softmax"]
    linear = ["efficient", "linear", "taylor", "flatten", "agent", "pola", "litemla"]
    return [spec_of(value) for value in [*reference, *linear]]


def build_kwargs(model: Spec, variant: Spec) -> dict[str, Any]:
    """``build_model`` kwargs: the variant's options split between the attention and the model family."""
    accepted = set(attention_options(variant.name))
    attention = {key: value for key, value in variant.options.items() if key in accepted}
    family = {key: value for key, value in variant.options.items() if key not in accepted}
    kwargs = {"name": model.name, "num_classes": NUM_CLASSES, "attention": variant.name}
    return kwargs | {"attention_options": attention, **model.options, **family}


@dataclass(frozen=True)
class Classes:
    """What ``training.run.build_module`` reads of a datamodule, for ``count`` classes and no dataset."""

    count: int
    ignore_index: int = 255
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)

    @property
    def num_classes(self) -> int:
        return self.count

    @property
    def classes(self) -> list[str]:
        return [f"class {index}" for index in range(self.count)]

    @property
    def palette(self) -> list[tuple[int, int, int]]:
        return [(index, index, index) for index in range(self.count)]


def training_module(kwargs: dict[str, Any], loss: dict[str, Any] | None = None) -> SegmentationModule:
    """train.py's LightningModule (``training.run.build_module``) around the network of ``build_model`` kwargs
    (``build_kwargs``); ``loss``: conf/loss keys over the default's (``chunk_rows``)."""
    from ..cli import compose_command
    from ..config import plain
    from ..training.run import build_module

    model = dict(kwargs)
    name, attention, classes = model.pop("name"), model.pop("attention"), model.pop("num_classes")
    attention_options = model.pop("attention_options", {})
    cfg = compose_command("train", [f"model={name}", f"attention={attention}", "data=synthetic"])
    with open_dict(cfg):
        cfg.model.update(model)
        cfg.attention.options = {**plain(cfg.attention.options), **attention_options}
        cfg.loss.update(loss or {})
    return build_module(cfg, Classes(classes))  # type: ignore[arg-type]


class TrainStep:
    """One training step to call: a ``training_module`` with the module's own loss (``head_losses``), its
    AdamW optimizer and one random batch of ``size`` (a side or (height, width)). ``compiled`` compiles the
    network in place (its first steps compile); ``kernel`` is the SEGATTN_KERNEL value it is built under."""

    def __init__(
        self,
        kwargs: dict[str, Any],
        size: int | tuple[int, int],
        batch: int,
        dtype: str,
        device: torch.device,
        checkpointing: bool = False,
        compiled: bool = False,
        kernel: str = "auto",
    ) -> None:
        height, width = (size, size) if isinstance(size, int) else size
        kwargs = dict(kwargs)  # options of the step in the spec: loss_chunk_rows, grad_checkpointing
        chunk_rows = kwargs.pop("loss_chunk_rows", None)
        checkpointing = checkpointing or bool(kwargs.get("grad_checkpointing"))
        self.device, self.dtype = device, DTYPES[dtype]
        with kernel_path(kernel):
            self.module = training_module(kwargs, {"chunk_rows": chunk_rows}).to(device).train()
        self.model = self.module.model
        self.model.set_grad_checkpointing(checkpointing)
        self.compiled = compiled
        if compiled:
            self.model.compile(**compile_options())
        self.optimizer = torch.optim.AdamW(self.model.param_groups(lr=1e-4, weight_decay=0.01))
        self.images = torch.randn(batch, 3, height, width, device=device)
        self.masks = torch.randint(0, NUM_CLASSES, (batch, height, width), device=device)

    def __call__(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        with autocast_for(self.device, self.dtype):
            loss, aux_loss = self.module.head_losses(self.images, self.masks)
        if aux_loss is not None:
            loss = loss + self.model.aux_weight * aux_loss
        loss.backward()
        self.optimizer.step()


def variants_for(settings: ModelSettings, model: Spec) -> list[Spec]:
    specs = default_variants(model.name) if settings.variants is None else settings.variants
    return with_kernels(with_compiled(specs, settings.compile), settings.kernels)


def row_label(variant: str, batch: int, settings: ModelSettings) -> str:
    """A table row: the variant, with its batch when the run has several."""
    return f"{variant}, batch {batch}" if len(settings.batches) > 1 else variant


def time_steps(
    settings: ModelSettings, device: torch.device, save: Callable[[list, list], None] | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Median step time per (model, variant, dtype, size, batch), the variants of one size and batch timed
    round-robin; and with ``settings.profile``, the ``profile_steps`` rows. ``save(rows, profiles)`` after
    each size and batch: a run cut short keeps what it measured."""
    deadline = time.monotonic() + settings.time_budget if settings.time_budget else float("inf")
    rows: list[dict[str, Any]] = []
    profiles: list[dict[str, Any]] = []
    for model in settings.models:
        variants = variants_for(settings, model)
        for dtype in settings.dtypes:
            history: dict[tuple[str, int], tuple[int, float]] = {}  # (label, batch) -> (pixels, seconds)
            failed: dict[tuple[str, int], str] = {}
            for height, width in settings.shapes:
                for batch in settings.batches:
                    base = {"model": model.label, "dtype": dtype, "size": size_label(height, width)}
                    base |= {"height": height, "width": width, "batch": batch}
                    steps = steps_to_time(
                        model, variants, base, history, failed, rows, settings, device, deadline
                    )
                    shape = f"{format_image_size(height, width)} ×{batch}"
                    progress(f"model {model.label} {dtype} {shape}: {', '.join(steps) or 'nothing to time'}")
                    errors: dict[str, str] = {}
                    samples = round_robin(steps, device, settings, errors)
                    for label, times in samples.items():
                        if label in errors:
                            failed[label, batch] = errors[label]
                            rows.append({**base, "variant": label, "status": errors[label].split(":")[0]})
                            rows[-1]["note"] = errors[label]
                            continue
                        seconds = statistics.median(times)
                        history[label, batch] = (height * width, seconds)
                        rows.append(
                            {**base, "variant": label, "seconds": seconds, "repeats": len(times)}
                            | {"images_per_s": batch / seconds, "status": "ok", "note": ""}
                        )
                    if settings.profile and settings.profile_size in (None, (height, width)):
                        timed = {label: step for label, step in steps.items() if label not in errors}
                        profiles += profile_steps(timed, base, variants, device)
                    del steps
                    if save:
                        save(rows, profiles)
        add_speedups(rows, model.label, variants[0].label)
    return rows, profiles


def profile_steps(
    steps: dict[str, TrainStep], base: dict[str, Any], variants: list[Spec], device: torch.device
) -> list[dict[str, Any]]:
    """One more step of each of ``steps`` (warm: just timed) under ``torch.profiler``: its ``self_times``
    rows (the top 40 kernels, or ops on the CPU, and "other"), with the step's model, size and kernel path."""
    kernels = {variant.label: variant.kernel for variant in variants}
    out = []
    for label, step in steps.items():
        for row in self_times(step, device):
            out.append({**base, "variant": label, "kernel": kernels[label], **row})
    return out


def steps_to_time(
    model: Spec,
    variants: list[Spec],
    base: dict[str, Any],
    history: dict[tuple[str, int], tuple[int, float]],
    failed: dict[tuple[str, int], str],
    rows: list[dict[str, Any]],
    settings: ModelSettings,
    device: torch.device,
    deadline: float,
) -> dict[str, TrainStep]:
    """A ``TrainStep`` per variant to time at ``base``'s size and batch; a row for each of the others saying
    why not: failed at a smaller size, predicted too slow, past the run's time budget, or failed to build
    (a bad option, a kernel path this machine lacks, no memory)."""
    steps: dict[str, TrainStep] = {}
    batch, pixels = base["batch"], base["height"] * base["width"]
    for variant in variants:
        key = (variant.label, batch)
        if key in failed:
            reason = f"skipped: {failed[key]}"
        elif time.monotonic() > deadline:
            reason = f"skipped: past the run's time budget of {settings.time_budget:g} s"
        else:
            reason = predicted_too_slow(variant, pixels, history.get(key), settings)
        if reason is None:
            try:
                args = (build_kwargs(model, variant), (base["height"], base["width"]), batch, base["dtype"])
                steps[variant.label] = TrainStep(
                    *args, device, compiled=variant.compiled, kernel=variant.kernel
                )
                continue
            except (ValueError, TypeError, RuntimeError) as error:
                reason = failed[key] = f"{'oom' if is_out_of_memory(error) else 'error'}: {str(error)[:200]}"
        rows.append({**base, "variant": variant.label, "status": reason.split(":")[0], "note": reason})
    return steps


def predicted_too_slow(
    variant: Spec, pixels: int, last: tuple[int, float] | None, settings: ModelSettings
) -> str | None:
    """Why a step is not timed at ``pixels`` per image, predicted from its ``last`` (pixels, seconds)."""
    if last is None:
        return None
    last_pixels, seconds = last
    exponent = 2 if attention_class(variant.name).quadratic else 1  # cost in pixels² (N²) or pixels (N)
    predicted = seconds * (pixels / last_pixels) ** exponent
    if predicted > settings.max_step_seconds:
        return f"skipped: ~{predicted:.0f} s/step predicted > {settings.max_step_seconds:g} s"
    return None


def warmup_rounds(steps: dict[str, TrainStep], device: torch.device) -> int:
    """Untimed rounds before the timed ones: two where a first step compiles (``torch.compile``, or the
    Triton kernels' JIT on a GPU), so the second runs what is then timed; one otherwise."""
    compiling = any(step.compiled for step in steps.values())
    return 2 if compiling or device.type == "cuda" else 1


def round_robin(
    steps: dict[str, TrainStep], device: torch.device, settings: ModelSettings, failed: dict[str, str]
) -> dict[str, list[float]]:
    """Warm-up rounds (``warmup_rounds``), then ``repeats`` timed rounds of one step per variant."""
    warmup = warmup_rounds(steps, device)
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
    """``speedup`` = step time of ``reference`` / this variant's (same model, size, batch, dtype)."""
    mine = [row for row in rows if row["model"] == model and row["status"] == "ok"]
    times = {(r["dtype"], r["size"], r["batch"]): r["seconds"] for r in mine if r["variant"] == reference}
    for row in mine:
        if (key := (row["dtype"], row["size"], row["batch"])) in times:
            row["speedup"] = times[key] / row["seconds"]


def memory_child(task: dict[str, Any], emit: Emit) -> None:
    """Child process: peak memory of one training step per (size, batch), fresh model and optimizer each (a
    compiled variant compiles on a throwaway step first: the compiler's own memory stays out of the peak)."""
    return_freed_memory()
    device = torch.device(task["device"])
    make = functools.partial(TrainStep, task["kwargs"], dtype=task["dtype"], device=device)
    make = functools.partial(make, compiled=task["compiled"], kernel=task["kernel"])
    for size, height, width, batch in task["cases"]:
        if task["compiled"]:
            make((height, width), batch)()
        with PeakMemory(device) as peak:
            step = make((height, width), batch)
            step()
            del step
        emit({"size": size, "batch": batch, "peak_bytes": peak.peak})


def measure_memory(rows: list[dict[str, Any]], settings: ModelSettings, device: torch.device) -> None:
    """Fill ``peak_bytes`` and ``peak_bytes_per_mpx`` (per megapixel of the batch) of the timed rows, one
    fresh child per (model, variant, dtype)."""
    for model in settings.models:
        for variant in variants_for(settings, model):
            for dtype in settings.dtypes:
                key = (model.label, variant.label, dtype)
                mine = [
                    r for r in rows if (r["model"], r["variant"], r["dtype"]) == key and r["status"] == "ok"
                ]
                if not mine:
                    continue
                task = {"kwargs": build_kwargs(model, variant), "dtype": dtype, "device": str(device)}
                task |= {"cases": [(r["size"], r["height"], r["width"], r["batch"]) for r in mine]}
                task |= {"compiled": variant.compiled, "kernel": variant.kernel}
                fill_peaks(mine, ("size", "batch"), memory_child, task, settings.memory_timeout)
                for row in mine:
                    if "peak_bytes" in row:
                        row["peak_bytes_per_mpx"] = per_megapixel(row["peak_bytes"], row)


def per_megapixel(peak_bytes: float, row: dict[str, Any]) -> float:
    """Bytes per megapixel of the images a step trains on (batch × height × width)."""
    return peak_bytes / (row["batch"] * row["height"] * row["width"] / 1e6)


def measured_lines(row: dict[str, Any]) -> list[str]:
    lines = [f"{row['images_per_s']:.3g} img/s", f"{row['seconds']:.3g} s/step"]
    if "speedup" in row:
        lines.append(f"{row['speedup']:.3g}× first")
    if "peak_bytes_per_mpx" in row:
        lines.append(f"{format_bytes(row['peak_bytes_per_mpx'])}/MP")
    return lines


def report(rows: list[dict[str, Any]], settings: ModelSettings, out_dir: Path) -> None:
    """One table per (model, dtype), a row per variant (and batch); model.csv; model.png (images/s and peak
    memory against megapixels per image)."""
    write_csv(out_dir / "model.csv", rows)
    shapes = settings.shapes
    panels = []
    for model in settings.models:
        variants = [variant.label for variant in variants_for(settings, model)]
        labels = [row_label(v, b, settings) for b in settings.batches for v in variants]
        for dtype in settings.dtypes:
            mine = {
                (row_label(r["variant"], r["batch"], settings), r["size"]): r
                for r in rows
                if (r["model"], r["dtype"]) == (model.label, dtype)
            }
            table = grid(labels, [size_label(*hw) for hw in shapes], mine, measured_lines)
            batches = " and ".join(map(str, settings.batches))
            caption = (
                f"one training step (forward, train.py's loss, backward, AdamW) at batch {batches}, median "
                f"of {settings.repeats} after warm-up (compilation included); speed-up relative to the first "
                f"variant ({variants[0]}); peak = weights + optimizer state + activations, fresh process; "
                "/MP = peak per megapixel of the batch"
            )
            columns = ["variant"] + [format_image_size(*hw) for hw in shapes]
            print_table(f"model {model.label}, {dtype}", columns, table, caption)
            speed = Panel(f"{model.label}, {dtype}", "megapixels per image", "images / s")
            memory = Panel(f"{model.label}, {dtype}", "megapixels per image", "peak bytes")
            for label, row in mine.items():
                if row["status"] == "ok":
                    megapixels = row["height"] * row["width"] / 1e6
                    speed.add(label[0], megapixels, row["images_per_s"])
                    if row.get("peak_bytes"):
                        memory.add(label[0], megapixels, row["peak_bytes"])
            panels += [speed, memory] if settings.memory else [speed]
    plot_panels(out_dir / "model.png", panels, columns=2 if settings.memory else 1)


def print_profiles(profiles: list[dict[str, Any]], top: int = 10) -> None:
    """The ``top`` kernels (or ops, on the CPU) of each profiled step, one table."""
    table, shown = [], {}
    for row in profiles:
        step = (row["model"], row["dtype"], row["size"], row["batch"], row["variant"])
        shown[step] = shown.get(step, 0) + 1
        if shown[step] <= top:
            what = [row["variant"], f"{row['size']} ×{row['batch']}", row["name"][:70]]
            table.append([*what, f"{row['self_ms']:.3f}", str(row["calls"]), f"{row['share']:.1%}"])
    caption = (
        "one training step after the timed ones, torch.profiler: self time per kernel on CUDA (per op on "
        f"the CPU), the top {top} of each step; share = of the step's total. All: model_profile.csv"
    )
    columns = ["variant", "size", "kernel or op", "self ms", "calls", "share"]
    print_table("model profile: where a step spends its time", columns, table, caption)


def save_rows(out_dir: Path, rows: list[dict[str, Any]], profiles: list[dict[str, Any]]) -> None:
    """model.csv, and model_profile.csv once there are profiled steps."""
    write_csv(out_dir / "model.csv", rows)
    if profiles:
        write_csv(out_dir / "model_profile.csv", profiles)


def run(settings: ModelSettings, device: torch.device, out_dir: Path) -> list[dict[str, Any]]:
    rows, profiles = time_steps(settings, device, save=functools.partial(save_rows, out_dir))
    if settings.memory:
        measure_memory(rows, settings, device)
    report(rows, settings, out_dir)
    if profiles:
        print_profiles(profiles)
    return rows
