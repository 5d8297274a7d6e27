"""``bench op``'s profile: one call of each variant split into host and device time by ``torch.profiler``.

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


def profile_call(fn: Callable[[], object], device: torch.device, warmup: int = 2) -> dict[str, Any]:
    """Host and device seconds, ATen ops and kernel launches of one call of ``fn`` after ``warmup`` calls
    (the first compiles); ``device_seconds`` is None on the CPU."""
    from torch.autograd import DeviceType
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
