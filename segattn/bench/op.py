"""``bench op``: each variant's token mixing alone against the memory-traffic floor of the same size.

The op is ``module.mix_tokens(q, k, v, hw)`` on [B, N, C] inputs: everything between the shared qkv and output
projections (head split/merge, feature maps, kernel products, normaliser and variant extras such as FLatten's
focusing map and depthwise conv, or LiteMLA's multi-scale aggregation, whose extra heads widen the output to
(1 + S)·C). q, k, v are the column blocks of one [B, N, 3C] tensor, as the qkv projection makes them; variants
that reduce keys/values in ``project`` get theirs from an untimed ``project`` call.

References (``floors``):
- ``floor``: ``torch.addcmul(q, k, v, out=buf)``, one elementwise pass into an existing buffer that moves
  exactly the bytes any attention must, at the best bandwidth the device gives an op. A variant's ratio is
  time / floor forward, time / (2·floor) forward+backward.
- ``matmuls``: the batched matmuls a kernel-product linear attention cannot avoid (forward φ(K)ᵀ[V | 1] and
  φ(Q)·context, backward four more), head-major, contiguous, fp32 (the variants' compute dtype). At small
  widths these, not the bytes, set the pace.
- ``copy_floor_seconds`` (in the ``floor`` row): those bytes at the device's copy bandwidth
  (``copy_bandwidth``), the lower bound of any attention; the ``floor`` op also pays a launch.

``kernels`` times a variant with a Triton path once per implementation (``<variant>@torch``,
``<variant>@triton``) and once per launch tuning asked for (``<variant>@triton:128x8x4``: tokens per block,
warps, reduction programs per multiprocessor; ``launch.Tuning``), the sweep its defaults are chosen from;
``compile=true`` adds the plain formulas under torch.compile (which never runs the Triton kernels). Every
configuration gets at least ``MIN_REPEATS`` timed repeats after warm-up calls that include compilation; one
call per variant is then profiled into host and device time (``profile``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from ..attention import AttentionBase, attention_class, build_attention
from ..cpu_memory import return_freed_memory
from .floors import MatmulFloor, copy_bandwidth, floor_passes, moved_bytes
from .graphs import GRAPHS, graphed
from .measure import Emit, PeakMemory, autocast_for, fill_peaks, interleaved_medians
from .profile import print_profile, profile_call
from .report import Panel, format_seconds, grid, plot_panels, print_table, progress, write_csv
from .specs import Spec, compile_options, format_count, grid_for, with_compiled

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
MODES = {"fwd": "forward", "fwdbwd": "forward+backward"}
FLOOR = "floor"
COPY_FLOOR = "copy floor"  # the plots' label of the copy-bandwidth floor
MATMULS = "matmuls"
REFERENCE = "softmax"
DEFINITION = (
    "op = module.mix_tokens(q, k, v, hw) on [B, N, C] (everything between the qkv and output projections, "
    "incl. FLatten's focusing map and DWC, LiteMLA's multi-scale aggregation); "
    "floor = addcmul(q, k, v, out=buf), one pass reading q, k, v "
    "and writing the output; matmuls = the kernel products alone (2 bmm forward, 6 forward+backward, fp32); "
    "fwd+bwd adds the gradients w.r.t. q, k, v and the variant's own parameters; "
    "ratio = time / floor (fwd) or time / (2·floor) (fwd+bwd), and time / matmuls; "
    "bf16 = bf16 inputs under autocast; copy floor = the bytes a linear attention moves (q, k, v, o; "
    "fwd+bwd also dO, dq, dk, dv) at the copy bandwidth of a large tensor. "
    "Cells: median time, ratio, peak memory above the inputs (fresh process)."
)


@dataclass
class OpSettings:
    variants: list[Spec]
    sizes: list[int]
    dtypes: list[str] = field(default_factory=lambda: ["fp32", "bf16"])
    modes: list[str] = field(default_factory=lambda: ["fwd", "fwdbwd"])
    batch: int = 1
    dim: int = 64
    heads: int = 2
    repeats: int = 5
    warmup: int = 1
    config_seconds: float = 20.0
    max_call_seconds: float = 60.0
    clock: str = "wall"
    memory: bool = True
    memory_timeout: float = 1800.0
    compile: bool = False  # also each variant's compiled twin
    kernels: list[str] = field(default_factory=lambda: ["auto"])  # SEGATTN_KERNEL values to time side by side
    profile: bool = True  # one call per variant under torch.profiler: host and device time
    profile_tokens: int | None = None  # None: the largest size each variant ran at
    cuda_graphs: bool = False  # also each eager variant replayed from a CUDA graph (``bench.graphs``)


def labelled_variants(settings: OpSettings) -> list[tuple[str, Spec, str]]:
    """(label, spec, kernel backend) of every timed module: an eager variant with a Triton path once per
    kernel of ``settings.kernels`` (``<spec>@<kernel>`` when several), others once ("auto"); with
    ``cuda_graphs``, a ``+graphs`` twin of each eager one."""
    out = []
    for spec in settings.variants:
        has_triton = attention_class(spec.name).triton_path and not spec.compiled
        kernels = settings.kernels if has_triton else ["auto"]
        several = len(kernels) > 1
        out += [(f"{spec.label}@{kernel}" if several else spec.label, spec, kernel) for kernel in kernels]
    graphs = [(label + GRAPHS, spec, kernel) for label, spec, kernel in out if not spec.compiled]
    return out + graphs if settings.cuda_graphs else out


def build_variant(
    spec: Spec, dim: int, heads: int, device: torch.device, kernel: str = "auto"
) -> AttentionBase:
    """The attention module of ``spec`` on the ``kernel`` path (a SEGATTN_KERNEL value, "triton" with an
    optional ``:tuning``; "auto": as that variable says); a compiled spec's ``mix_tokens`` runs under
    ``torch.compile``."""
    module = build_attention(spec.name, dim, heads, **spec.options).to(device)
    backend = kernel.split(":")[0]
    if backend != "auto":
        module.kernel_backend = backend
    if spec.compiled:
        module.mix_tokens = torch.compile(module.mix_tokens, **compile_options())
    return module


def launch_sizes(kernel: str) -> contextlib.AbstractContextManager:
    """The context a ``kernel`` label's calls run in: its Triton launch tuning (``triton:128x8x4``) if any."""
    if ":" not in kernel:
        return contextlib.nullcontext()
    from ..attention.triton.launch import Tuning, tuned

    return tuned(Tuning.parse(kernel.split(":", 1)[1]))


class OpCase:
    """One variant's ``mix_tokens`` at one size, dtype and mode, inputs allocated, ready to call forward and
    backward under ``kernel``'s launch tuning."""

    def __init__(
        self,
        module: AttentionBase,
        tokens: int,
        dtype: str,
        mode: str,
        batch: int,
        device: torch.device,
        kernel: str = "auto",
    ) -> None:
        self.module, self.mode, self.hw, self.kernel = module, mode, grid_for(tokens), kernel
        self.dtype = DTYPES[dtype]
        self.device = device
        dim = module.dim
        grad = mode == "fwdbwd"
        x = torch.randn(batch, tokens, dim, device=device)
        with torch.no_grad():
            projected = module.project(x, self.hw)
        if projected[1].shape[1] == tokens:  # q, k, v as column blocks of one [B, N, 3C] tensor
            qkv = torch.randn(batch, tokens, 3 * dim, device=device, dtype=self.dtype)
            self.leaves = [qkv.requires_grad_(grad)]
        else:  # keys/values reduced in project: its outputs, computed untimed
            self.leaves = [t.detach().to(self.dtype).requires_grad_(grad) for t in projected]
        self.params = [p for p in module.parameters() if p.requires_grad] if grad else []
        self.grad_out = None
        if grad:  # shaped like the output, which is wider than C where mix_tokens adds heads (LiteMLA)
            with torch.no_grad(), autocast_for(device, self.dtype):
                width = module.mix_tokens(*self.inputs(), self.hw).shape[-1]
            self.grad_out = torch.randn(batch, tokens, width, device=device, dtype=self.dtype)
        self.floor_out = torch.empty(batch, tokens, dim, device=device, dtype=self.dtype)
        module.train(grad)

    def inputs(self) -> list[torch.Tensor]:
        return self.leaves[0].chunk(3, dim=-1) if len(self.leaves) == 1 else self.leaves

    def __call__(self) -> None:
        with launch_sizes(self.kernel):
            if self.mode == "fwd":
                with torch.no_grad(), autocast_for(self.device, self.dtype):
                    self.module.mix_tokens(*self.inputs(), self.hw)
                return
            inputs = self.inputs()
            with autocast_for(self.device, self.dtype):
                out = self.module.mix_tokens(*inputs, self.hw)
            torch.autograd.grad(out, [*inputs, *self.params], self.grad_out, allow_unused=True)

    def floor(self) -> None:
        q, k, v = self.inputs()
        with torch.no_grad():
            torch.addcmul(q, k, v, out=self.floor_out)


def skip_reason(
    module: AttentionBase, tokens: int, history: dict[str, Any], settings: OpSettings
) -> str | None:
    """Why a configuration is not run: too many tokens, failed at a smaller size, or predicted too slow."""
    if module.max_tokens is not None and tokens > module.max_tokens:
        return f"skipped: max_tokens={module.max_tokens}"
    if "failed" in history:
        return f"skipped: failed at {format_count(history['failed'])} tokens"
    if "seconds" in history:
        exponent = 2 if module.quadratic else 1
        predicted = history["seconds"] * (tokens / history["tokens"]) ** exponent
        if predicted > settings.max_call_seconds:
            return f"skipped: ~{predicted:.0f} s/call predicted > {settings.max_call_seconds:g} s"
    return None


def time_ops(
    settings: OpSettings,
    device: torch.device,
    save: Callable[[list[dict[str, Any]]], None] = lambda rows: None,
) -> list[dict[str, Any]]:
    """Time every (variant, dtype, mode, size) with the floor of the same inputs, interleaved per size;
    ``save(rows)`` after each size: a run cut short keeps what it measured."""
    labelled = labelled_variants(settings)
    modules = {
        label: build_variant(spec, settings.dim, settings.heads, device, kernel)
        for label, spec, kernel in labelled
    }
    kernels = {label: kernel for label, _, kernel in labelled}
    bandwidth = copy_bandwidth(device, settings)
    progress(f"copy bandwidth {bandwidth / 1e9:.0f} GB/s")
    rows: list[dict[str, Any]] = []
    for dtype in settings.dtypes:
        for mode in settings.modes:
            history: dict[str, dict[str, Any]] = {label: {} for label in modules}
            for tokens in sorted(settings.sizes):
                base = {"dtype": dtype, "mode": mode, "tokens": tokens, "batch": settings.batch}
                base |= {"dim": settings.dim, "heads": settings.heads}
                cases: dict[str, OpCase] = {}
                for label, module in modules.items():
                    reason = skip_reason(module, tokens, history[label], settings)
                    if reason:
                        rows.append({"variant": label, **base, "status": "skipped", "note": reason})
                    else:
                        case = OpCase(module, tokens, dtype, mode, settings.batch, device, kernels[label])
                        cases[label] = graphed(label, case)
                if not cases:
                    continue
                progress(f"op {dtype} {mode} {format_count(tokens)} tokens: {', '.join(cases)}")
                floor_case = next(iter(cases.values()))
                calls: dict[str, Callable[[], None]] = {
                    FLOOR: floor_case.floor,
                    MATMULS: MatmulFloor(floor_case, settings.heads),
                    **cases,
                }
                results = interleaved_medians(
                    calls, device, settings.repeats, settings.warmup, settings.config_seconds, settings.clock
                )
                floor_seconds, matmul_seconds = (
                    results[name][0] if isinstance(results[name], tuple) else float("nan")
                    for name in (FLOOR, MATMULS)
                )
                element_size = floor_case.floor_out.element_size()
                nbytes = 4 * settings.batch * tokens * settings.dim * element_size
                copy_seconds = moved_bytes(settings, tokens, mode, element_size) / bandwidth
                flops = 2 * settings.batch * tokens * settings.dim * (settings.dim // settings.heads + 1)
                flops *= 6 if mode == "fwdbwd" else 2
                rows.append(
                    {"variant": FLOOR, **base, "seconds": floor_seconds, "repeats": results[FLOOR][1]}
                    | {"status": "ok", "note": f"{nbytes / floor_seconds / 1e9:.1f} GB/s"}
                    | {"copy_floor_seconds": copy_seconds, "copy_bandwidth": bandwidth}
                )
                rows.append(
                    {"variant": MATMULS, **base, "seconds": matmul_seconds, "repeats": results[MATMULS][1]}
                    | {"status": "ok", "note": f"{flops / matmul_seconds / 1e9:.0f} GFLOP/s"}
                    | {"floor_seconds": floor_seconds}
                    | {"floor_ratio": matmul_seconds / (floor_seconds * floor_passes(mode))}
                )
                for label in cases:
                    result = results[label]
                    if isinstance(result, str):
                        history[label]["failed"] = tokens
                        rows.append(
                            {"variant": label, **base, "status": result.split(":")[0], "note": result}
                        )
                        continue
                    seconds, repeats = result
                    history[label].update(seconds=seconds, tokens=tokens)
                    ratio = seconds / (floor_seconds * floor_passes(mode))
                    rows.append(
                        {"variant": label, **base, "seconds": seconds, "repeats": repeats}
                        | {"floor_seconds": floor_seconds, "floor_ratio": ratio, "status": "ok", "note": ""}
                        | {"matmul_ratio": seconds / matmul_seconds, "copy_ratio": seconds / copy_seconds}
                    )
                save(rows)
                del cases, calls
    add_speedups(rows)
    return rows


def profile_ops(
    rows: list[dict[str, Any]], settings: OpSettings, device: torch.device
) -> list[dict[str, Any]]:
    """One profiled call per (variant, dtype, mode) of ``bench op``'s timed ``rows``, at
    ``settings.profile_tokens`` or else the largest size the variant ran at, on its own kernel path."""
    out = []
    for label, spec, kernel in labelled_variants(settings):
        for dtype in settings.dtypes:
            for mode in settings.modes:
                key = (label, dtype, mode)
                ran = [
                    r["tokens"]
                    for r in rows
                    if (r["variant"], r["dtype"], r["mode"]) == key and r["status"] == "ok"
                ]
                if not ran:
                    continue
                tokens = settings.profile_tokens if settings.profile_tokens in ran else max(ran)
                row = {"variant": label, "dtype": dtype, "mode": mode, "tokens": tokens, "note": ""}
                try:
                    module = build_variant(spec, settings.dim, settings.heads, device, kernel)
                    case = OpCase(module, tokens, dtype, mode, settings.batch, device, kernel)
                    row |= profile_call(graphed(label, case), device, warmup=max(2, settings.warmup))
                except RuntimeError as error:
                    row["note"] = f"error: {str(error)[:120]}"
                out.append(row)
                del row
    return out


def add_speedups(rows: list[dict[str, Any]]) -> None:
    """``vs_softmax`` = softmax seconds / variant seconds for the same dtype, mode and size."""
    reference = {
        (r["dtype"], r["mode"], r["tokens"]): r["seconds"]
        for r in rows
        if r["variant"] == REFERENCE and r["status"] == "ok"
    }
    for row in rows:
        key = (row["dtype"], row["mode"], row["tokens"])
        if row["status"] == "ok" and row["variant"] not in (FLOOR, MATMULS) and key in reference:
            row["vs_softmax"] = reference[key] / row["seconds"]


def memory_child(task: dict[str, Any], emit: Emit) -> None:
    """Child process: peak memory of one (variant, dtype, mode) at each size, ascending."""
    return_freed_memory()
    device = torch.device(task["device"])
    spec = Spec(task["name"], task["options"], compiled=task["compiled"])
    module = build_variant(spec, task["dim"], task["heads"], device, task["kernel"])
    sized = functools.partial(OpCase, module, dtype=task["dtype"], mode=task["mode"], batch=task["batch"])
    sized = functools.partial(sized, device=device, kernel=task["kernel"])
    sized(task["sizes"][0])()  # one-time set-up
    for tokens in task["sizes"]:
        case = sized(tokens)
        if spec.compiled:
            case()  # compiles this size's graph outside the measured block
        with PeakMemory(device) as peak:
            case()
        emit({"tokens": tokens, "peak_bytes": peak.peak})
        del case


def measure_memory(rows: list[dict[str, Any]], settings: OpSettings, device: torch.device) -> None:
    """Fill ``peak_bytes`` of the timed rows, one fresh child per (variant, dtype, mode)."""
    for label, spec, kernel in labelled_variants(settings):
        if label.endswith(GRAPHS):  # a replay allocates nothing: the eager row's peak is its inputs' and more
            continue
        for dtype in settings.dtypes:
            for mode in settings.modes:
                mine = [
                    r
                    for r in rows
                    if (r["variant"], r["dtype"], r["mode"]) == (label, dtype, mode) and r["status"] == "ok"
                ]
                if not mine:
                    continue
                task = {"name": spec.name, "options": spec.options, "compiled": spec.compiled}
                task |= {"kernel": kernel}
                task |= {"dtype": dtype, "mode": mode}
                task |= {"sizes": [r["tokens"] for r in mine], "device": str(device), "batch": settings.batch}
                task |= {"dim": settings.dim, "heads": settings.heads}
                fill_peaks(mine, "tokens", memory_child, task, settings.memory_timeout)


def measured_lines(row: dict[str, Any]) -> list[str]:
    lines = [format_seconds(row["seconds"])]
    if row["variant"] == FLOOR:
        lines.append(row["note"])
        copy_floor = format_seconds(row["copy_floor_seconds"])
        lines.append(f"copy floor {copy_floor} ({row['copy_bandwidth'] / 1e9:.0f} GB/s)")
    elif row["variant"] == MATMULS:
        lines += [row["note"], f"{row['floor_ratio']:.1f}× floor"]
    else:
        lines.append(f"{row['floor_ratio']:.1f}× floor, {row['matmul_ratio']:.1f}× matmuls")
        lines.append(f"{row['copy_ratio']:.0f}× copy floor")
        if "vs_softmax" in row and row["variant"] != REFERENCE:
            lines.append(f"{row['vs_softmax']:.2g}× faster than softmax")
    return lines


def report(rows: list[dict[str, Any]], settings: OpSettings, out_dir: Path) -> None:
    """Print one table per (dtype, mode), write op.csv and the log-log plots op_time.png, op_memory.png."""
    write_csv(out_dir / "op.csv", rows)
    sizes = sorted(settings.sizes)
    labels = [FLOOR, MATMULS] + [label for label, _, _ in labelled_variants(settings)]
    time_panels, memory_panels = [], []
    for dtype in settings.dtypes:
        for mode in settings.modes:
            mine = {(r["variant"], r["tokens"]): r for r in rows if (r["dtype"], r["mode"]) == (dtype, mode)}
            table = grid(labels, sizes, mine, measured_lines)
            title = f"op {MODES[mode]}, {dtype}, B={settings.batch}, C={settings.dim}, heads={settings.heads}"
            print_table(title, ["variant"] + [format_count(n) for n in sizes], table, DEFINITION)
            floor_label = "2×floor" if mode == "fwdbwd" else FLOOR
            dashed = {floor_label, COPY_FLOOR, MATMULS}  # references, not variants
            time_panel = Panel(f"{MODES[mode]}, {dtype}", "tokens", "seconds", dashed=dashed)
            memory_panel = Panel(f"{MODES[mode]}, {dtype}", "tokens", "peak bytes above inputs")
            for row in mine.values():
                if row["status"] != "ok":
                    continue
                if row["variant"] == FLOOR:
                    time_panel.add(floor_label, row["tokens"], row["seconds"] * floor_passes(mode))
                    time_panel.add(COPY_FLOOR, row["tokens"], row["copy_floor_seconds"])
                    continue
                time_panel.add(row["variant"], row["tokens"], row["seconds"])
                if row.get("peak_bytes"):
                    memory_panel.add(row["variant"], row["tokens"], row["peak_bytes"])
            time_panels.append(time_panel)
            memory_panels.append(memory_panel)
    plot_panels(out_dir / "op_time.png", time_panels)
    if settings.memory:
        plot_panels(out_dir / "op_memory.png", memory_panels)


def run(settings: OpSettings, device: torch.device, out_dir: Path) -> list[dict[str, Any]]:
    if settings.compile:  # two warm-up calls: the first compiles, the second runs what is then timed
        settings = replace(
            settings, variants=with_compiled(settings.variants, True), warmup=max(settings.warmup, 2)
        )
    rows = time_ops(settings, device, save=functools.partial(write_csv, out_dir / "op.csv"))
    if settings.profile:
        profiles = profile_ops(rows, settings, device)
        write_csv(out_dir / "op_profile.csv", profiles)
        print_profile(profiles)
    if settings.memory:
        measure_memory(rows, settings, device)
    report(rows, settings, out_dir)
    return rows
