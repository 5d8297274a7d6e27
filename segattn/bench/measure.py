"""Timing, peak memory and isolated child processes: the measuring primitives every bench part shares.

Peak memory is measured in a child forked from a server that has already imported torch and segattn, so every
configuration starts from a clean allocator without paying the imports again (``PeakMemory`` says what the
peak is). A child gets a hard memory guard, so an oversized probe fails with an allocation error rather than
pulling the machine into the OOM killer.
"""

from __future__ import annotations

import multiprocessing as mp
import resource
import statistics
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

Emit = Callable[[dict[str, Any]], None]

# Extra virtual address space allowed on CPU beyond the budget: thread stacks and malloc arenas are
# reserved but mostly never touched, so RLIMIT_AS needs head room above the resident budget.
_ADDRESS_SPACE_SLACK = 1 << 30
_PRELOAD = [
    "torch",
    "segattn.attention",
    "segattn.models",
    "segattn.bench.op",
    "segattn.bench.model",
    "segattn.bench.maxres",
]
_context: Any = None


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# Host clocks: wall time, or this process's CPU time, which a busy machine barely disturbs when torch
# runs one thread (with several threads it also counts their spin-waiting).
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


def time_call(fn: Callable[[], object], device: torch.device, clock: str = "wall") -> float:
    """Seconds one call of ``fn`` takes; on CUDA measured with events between synchronisations."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    now = CLOCKS[clock]
    begin = now()
    fn()
    return now() - begin


# The fewest timed repeats a configuration gets when it is slower than the seconds it was given (unless
# fewer were asked for): a median of one sample is a guess.
MIN_REPEATS = 5


def interleaved_medians(
    calls: dict[str, Callable[[], object]],
    device: torch.device,
    repeats: int,
    warmup: int,
    config_seconds: float,
    clock: str = "wall",
) -> dict[str, tuple[float, int] | str]:
    """Median seconds and sample count per call, timing the calls round-robin so noise hits all alike.

    Each call is warmed up first (``warmup`` calls: the first compiles, whether torch.compile or a Triton
    JIT); the last warm-up call sets how many repeats fit in ``config_seconds``, never fewer than
    ``MIN_REPEATS`` (or ``repeats`` if that is less). A call that raises is dropped and its error returned.
    """
    results: dict[str, tuple[float, int] | str] = {}
    wanted: dict[str, int] = {}
    for name, fn in calls.items():
        try:
            seconds = [time_call(fn, device, clock) for _ in range(max(1, warmup))][-1]
        except RuntimeError as error:
            results[name] = f"{'oom' if is_out_of_memory(error) else 'error'}: {str(error)[:120]}"
            continue
        fitting = int(config_seconds / max(seconds, 1e-9))
        wanted[name] = min(repeats, max(MIN_REPEATS, fitting))
    samples: dict[str, list[float]] = {name: [] for name in wanted}
    for round_ in range(max(wanted.values(), default=0)):
        for name, count in wanted.items():
            if round_ < count:
                samples[name].append(time_call(calls[name], device, clock))
    results.update({name: (statistics.median(times), len(times)) for name, times in samples.items()})
    return results


def _proc_status_kib(key: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(f"/proc/self/status has no {key} line")


def resident_bytes() -> int:
    """Current resident set size of this process (Linux)."""
    return _proc_status_kib("VmRSS") * 1024


def reset_cpu_peak() -> bool:
    """Reset the kernel's peak-RSS mark (and with it ``ru_maxrss``); False where the OS does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:
        return False
    return True


class PeakMemory:
    """Context manager: ``.peak`` = peak bytes inside the block above the level at entry.

    On CUDA ``max_memory_allocated``; on the CPU the resident high-water mark (``ru_maxrss``, reset at entry
    where Linux allows it). Without a reset ``ru_maxrss`` is the process's lifetime mark, still right for
    configurations run in ascending size order in a fresh process.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peak = 0

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
        else:
            reset_cpu_peak()
            self.base = resident_bytes()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            high = torch.cuda.max_memory_allocated(self.device)
        else:
            high = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        self.peak = max(0, high - self.base)


def total_memory_budget(device: torch.device, fraction: float = 0.8) -> int:
    """``fraction`` of the currently free GPU memory, or of the available RAM (MemAvailable)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * fraction)
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(int(line.split()[1]) * 1024 * fraction)
    raise RuntimeError("/proc/meminfo has no MemAvailable line; pass budget_gib explicitly")


def guard_memory(device: torch.device, limit: int) -> None:
    """Make allocations beyond ``limit`` bytes (above what is held now) raise instead of exhausting RAM."""
    if device.type == "cuda":
        held = torch.cuda.memory_allocated(device)
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, (held + limit) / total), device)
        return
    address_space = _proc_status_kib("VmSize") * 1024 + limit + _ADDRESS_SPACE_SLACK
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        address_space = min(address_space, hard)
    resource.setrlimit(resource.RLIMIT_AS, (address_space, hard))


def is_out_of_memory(error: BaseException) -> bool:
    message = str(error)
    oom_messages = ("can't allocate memory", "bad_alloc", "out of memory")
    return isinstance(error, torch.OutOfMemoryError | MemoryError) or any(m in message for m in oom_messages)


def _child(fn: Callable[[dict[str, Any], Emit], None], task: dict[str, Any], threads: int, conn: Any) -> None:
    torch.set_num_threads(threads)
    try:
        fn(task, conn.send)
    except BaseException as error:
        status = "oom" if is_out_of_memory(error) else "error"
        conn.send({"status": status, "error": f"{type(error).__name__}: {str(error)[:300]}"})
        if status == "error":
            traceback.print_exc()
    finally:
        conn.close()


def _forkserver() -> Any:
    global _context
    if _context is None:
        _context = mp.get_context("forkserver")
        _context.set_forkserver_preload(_PRELOAD)
    return _context


def run_isolated(
    fn: Callable[[dict[str, Any], Emit], None], task: dict[str, Any], timeout: float, daemon: bool = True
) -> tuple[list[dict[str, Any]], str]:
    """Run ``fn(task, emit)`` (a module-level function) in a fresh child with this process's thread count;
    returns what it emitted and how it ended: ``ok``, ``timeout`` (killed after ``timeout`` seconds) or
    ``killed (exit N)`` (died without reporting, e.g. the OOM killer). A child that starts processes of its
    own must not be a ``daemon``."""
    context = _forkserver()
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(fn, task, torch.get_num_threads(), sender), daemon=daemon)
    process.start()
    sender.close()
    messages: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    ending = "ok"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            ending = "timeout"
            process.kill()
            break
        if receiver.poll(min(left, 1.0)):
            try:
                messages.append(receiver.recv())
            except EOFError:
                break
        elif not process.is_alive() and not receiver.poll():
            break
    process.join()
    receiver.close()
    if ending == "ok" and process.exitcode != 0:
        ending = f"killed (exit {process.exitcode})"
    return messages, ending


def fill_peaks(
    rows: list[dict[str, Any]],
    key: str | tuple[str, ...],
    child: Callable[[dict[str, Any], Emit], None],
    task: dict[str, Any],
    timeout: float,
) -> None:
    """Fill ``peak_bytes`` of ``rows`` from a memory ``child`` run on ``task`` in a fresh process; it emits
    ``{key: …, "peak_bytes": …}`` per configuration (``key``: one column or several), matched to rows by those
    values. Rows it never reached get a note why."""
    keys = (key,) if isinstance(key, str) else key
    messages, ending = run_isolated(child, task, timeout)
    peaks = {
        tuple(message[k] for k in keys): message["peak_bytes"]
        for message in messages
        if all(k in message for k in keys)
    }
    failure = next((message["error"] for message in messages if "error" in message), ending)
    for row in rows:
        if (ident := tuple(row[k] for k in keys)) in peaks:
            row["peak_bytes"] = peaks[ident]
        else:
            row["note"] = (row["note"] + "; " if row["note"] else "") + f"memory: {failure}"


def autocast_for(device: torch.device, dtype: torch.dtype) -> torch.autocast:
    """Autocast to ``dtype`` for bf16/fp16 runs; a no-op context for fp32."""
    return torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)
