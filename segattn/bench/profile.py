"""``torch.profiler`` over one call: ``bench op``'s split of each variant's call into host and device time,
and ``bench model``'s self time per kernel (or, on the CPU, per op) of one training step.

Host time is the wall time the calling thread spends inside the call (Python, argument binding, ATen
dispatch, launches; with the profiler's own overhead on top), device time the sum of the GPU kernels and
copies the call ran. On a GPU, host time above device time means the call is bound by the host: the GPU
waits for launches. On the CPU there is no device: every op runs on the host, the device column says
"cpu" and the host time is the whole call. ``ops`` counts ATen ops (nested ones included), ``launches``
the kernel launches through the CUDA driver or runtime (Triton's and PyTorch's alike).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from .measure import synchronize
from .report import format_seconds, print_table

CALL = "segattn.bench.call"  # the profiler range around the profiled call


def profiled_events(fn: Callable[[], object], device: torch.device, warmup: int) -> Any:
    """``torch.profiler``'s key averages of one call of ``fn`` (inside the range ``CALL``) after ``warmup``
    calls; CUDA activity too where ``device`` is CUDA."""
    from torch.profiler import ProfilerActivity, profile, record_function

    for _ in range(warmup):
        fn()
    synchronize(device)
    cuda = device.type == "cuda"
    if not cuda:  # Kineto logs every missing GPU it probes for as an ERROR line: on the CPU there is none
        os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as profiler:
        with record_function(CALL):
            fn()
        synchronize(device)
    return profiler.key_averages()


def profile_call(fn: Callable[[], object], device: torch.device, warmup: int = 2) -> dict[str, Any]:
    """Host and device seconds, ATen ops and kernel launches of one call of ``fn`` after ``warmup`` calls
    (the first compiles); ``device_seconds`` is None on the CPU."""
    from torch.autograd import DeviceType

    events = profiled_events(fn, device, warmup)
    cuda = device.type == "cuda"
    host = next(event.cpu_time_total for event in events if event.key == CALL) / 1e6
    on_device = [event for event in events if event.device_type == DeviceType.CUDA]
    return {
        "host_seconds": host,
        "device_seconds": sum(event.self_device_time_total for event in on_device) / 1e6 if cuda else None,
        "ops": sum(event.count for event in events if event.key.startswith("aten::")),
        "launches": sum(event.count for event in events if "LaunchKernel" in event.key),
    }


def self_times(fn: Callable[[], object], device: torch.device, top: int = 40) -> list[dict[str, Any]]:
    """Where one call of ``fn`` spends its time, most first: on CUDA each kernel's (and copy's) self device
    time, on the CPU each op's self time (``CALL``: the host outside any op); ``name``, ``self_ms``,
    ``calls`` and ``share`` of the call's total, the ``top`` rows and one "other" row for the rest."""
    from torch.autograd import DeviceType

    cuda = device.type == "cuda"
    kind = DeviceType.CUDA if cuda else DeviceType.CPU
    times = []  # (name, microseconds, calls)
    for event in profiled_events(fn, device, warmup=0):
        if event.device_type == kind:
            spent = event.self_device_time_total if cuda else event.self_cpu_time_total
            times.append((event.key, spent, event.count))
    times.sort(key=lambda item: -item[1])
    total = sum(time for _, time, _ in times) or 1.0
    rest = times[top:]
    if rest:
        times = [
            *times[:top],
            ("other", sum(time for _, time, _ in rest), sum(calls for _, _, calls in rest)),
        ]
    return [
        {"name": name, "self_ms": time / 1e3, "calls": calls, "share": time / total}
        for name, time, calls in times
    ]


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
