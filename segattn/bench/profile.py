"""``bench op``'s profile: one call of each variant split into host and device time by ``torch.profiler``.

Host time is the wall time the calling thread spends inside the call (Python, argument binding, ATen
dispatch, launches; with the profiler's own overhead on top), device time the sum of the GPU kernels and
copies the call ran. On a GPU, host time above device time means the call is bound by the host: the GPU
waits for launches. On the CPU there is no device: every op runs on the host, the device column says
"cpu" and the host time is the whole call. ``ops`` counts ATen ops (nested ones included), ``launches``
the kernel launches through the CUDA driver or runtime (Triton's and PyTorch's alike).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .measure import synchronize
from .report import format_seconds, print_table

CALL = "segattn.bench.call"  # the profiler range around the profiled call


def profile_call(fn: Callable[[], object], device: torch.device, warmup: int = 2) -> dict[str, Any]:
    """Host and device seconds, ATen ops and kernel launches of one call of ``fn`` after ``warmup`` calls
    (the first compiles); ``device_seconds`` is None on the CPU."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    for _ in range(warmup):
        fn()
    synchronize(device)
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as profiler:
        with record_function(CALL):
            fn()
        synchronize(device)
    events = profiler.key_averages()
    host = next(event.cpu_time_total for event in events if event.key == CALL) / 1e6
    on_device = [event for event in events if event.device_type == DeviceType.CUDA]
    return {
        "host_seconds": host,
        "device_seconds": sum(event.self_device_time_total for event in on_device) / 1e6 if cuda else None,
        "ops": sum(event.count for event in events if event.key.startswith("aten::")),
        "launches": sum(event.count for event in events if "LaunchKernel" in event.key),
    }


def print_profile(rows: list[dict[str, Any]]) -> None:
    """The profile table: a row per (variant, dtype, mode) at the size it was profiled."""
    table = []
    for row in rows:
        if "host_seconds" not in row:
            table.append(
                [row["variant"], row["dtype"], row["mode"], f"{row['tokens']:,}", row["note"], "", "", ""]
            )
            continue
        device = "cpu" if row["device_seconds"] is None else format_seconds(row["device_seconds"])
        host = format_seconds(row["host_seconds"])
        counts = [str(row["ops"]), str(row["launches"])]
        table.append([row["variant"], row["dtype"], row["mode"], f"{row['tokens']:,}", host, device, *counts])
    caption = (
        "one call after warm-up, torch.profiler: host = wall time of the calling thread inside the call "
        '(with the profiler\'s overhead), device = GPU kernels and copies summed ("cpu": no device, every '
        "op runs on the host); ops = ATen ops incl. nested; launches = kernel launches. op_profile.csv"
    )
    columns = ["variant", "dtype", "mode", "tokens", "host", "device", "ops", "launches"]
    print_table("op profile: host and device time of one call", columns, table, caption)


def profile_ops(rows: list[dict[str, Any]], settings: Any, device: torch.device) -> list[dict[str, Any]]:
    """One profiled call per (variant, dtype, mode) of ``bench op``'s timed ``rows``, at
    ``settings.profile_tokens`` or else the largest size the variant ran at, on its own kernel path."""
    from .graphs import graphed
    from .op import OpCase, build_variant, labelled_variants

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
