"""The bench command end to end at tiny sizes, plus its measuring primitives against known quantities.

Nothing here asserts speed: timings on shared CI machines mean nothing. The smoke run checks that every
part writes its table, CSV and PNG with the expected rows and columns.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch
import torch._dynamo

from segattn.bench.__main__ import main
from segattn.bench.maxres import extrapolate, search
from segattn.bench.measure import PeakMemory, guard_memory, run_isolated
from segattn.bench.specs import grid_for, parse_count, spec_of
from segattn.cpu_memory import return_freed_memory

MIB = 1 << 20


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


def test_specs_read_names_options_and_counts():
    spec = spec_of({"name": "softmax", "sr_ratios": [1, 1, 1, 1], "attn_drop": 0.1})
    assert (spec.name, spec.options) == ("softmax", {"sr_ratios": [1, 1, 1, 1], "attn_drop": 0.1})
    assert spec.label == "softmax:sr_ratios=[1,1,1,1]:attn_drop=0.1"
    assert spec_of("flatten").options == {}
    assert [parse_count(t) for t in ("4096", "4k", "1m")] == [4096, 4096, 1 << 20]
    assert grid_for(65536) == (256, 256) and grid_for(240) == (15, 16)
    with pytest.raises(ValueError, match="expected a name"):
        spec_of({"feature_map": "relu"})


@pytest.mark.parametrize(
    ("limit", "start", "expected", "probed"),
    [
        (1000, 512, 896, [512, 1024, 768, 896]),  # grow, then bisect between 512 and 1024
        (300, 512, 256, [512, 256, 384]),  # start too large: halve, then bisect
        (10_000, 512, 2048, [512, 1024, 2048]),  # capped by max_size
        (100, 512, 0, [512, 256, 128]),  # nothing fits
    ],
)
def test_search_finds_the_largest_fitting_multiple(limit, start, expected, probed):
    calls = []

    def fits(size: int) -> bool:
        calls.append(size)
        return size <= limit

    assert search(fits, start=start, step=128, max_size=2048) == expected
    assert calls == probed


def test_extrapolate_inverts_a_linear_memory_model():
    # peak = 100 MiB + 64 bytes per pixel; at 4 GiB: side = sqrt((4 GiB - 100 MiB) / 64) = 8091 -> 8064.
    history = [{"size": s, "fits": True, "peak_bytes": 100 * MIB + 64 * s * s} for s in (256, 512, 1024)]
    side = math.isqrt((4096 - 100) * MIB // 64)
    assert extrapolate(history, 4096 * MIB, step=128) == side // 128 * 128 == 8064


def measure_known_allocation(task, emit):
    """Child, set up as the bench's memory children are: PeakMemory around a touched 64 MiB block."""
    return_freed_memory()
    with PeakMemory(torch.device("cpu")) as peak:
        block = torch.ones(64 * MIB // 4)
        del block
    emit({"peak_bytes": peak.peak})


def test_peak_memory_sees_a_known_allocation():
    # In a fresh process, as the bench measures: in this one, earlier tests leave the allocator in any state.
    messages, ending = run_isolated(measure_known_allocation, {}, timeout=60)
    assert ending == "ok"
    # ru_maxrss is a high-water mark: pages the process already had resident (freed earlier, reused by
    # this block) do not raise it, so allow a few MiB below the block's size.
    assert 56 * MIB <= messages[-1]["peak_bytes"] < 96 * MIB


def allocate_child(task, emit):
    """Child for the guard test: cap memory, then try to allocate ``task['mib']`` MiB."""
    guard_memory(torch.device("cpu"), task["limit_mib"] * MIB)
    torch.ones(task["mib"] * MIB // 4)
    emit({"status": "ok"})


@pytest.mark.slow
def test_memory_guard_turns_an_oversized_child_into_a_clean_oom():
    messages, ending = run_isolated(allocate_child, {"limit_mib": 256, "mib": 4096}, timeout=60)
    assert ending == "ok" and messages[-1]["status"] == "oom"
    messages, ending = run_isolated(allocate_child, {"limit_mib": 256, "mib": 64}, timeout=60)
    assert messages == [{"status": "ok"}]


@pytest.mark.slow
def test_bench_op_model_maxres_smoke_write_tables_csvs_and_plots(tmp_path, capsys):
    # One thread: on a busy 2-core machine two spinning OpenMP threads make tiny steps many times slower.
    args = ["grid=smoke", "device=cpu", "threads=1", "variants=[softmax,flatten]", f"out={tmp_path}"]
    for part in ("op", "model", "maxres"):
        assert main([part, *args]) == 0
    printed = capsys.readouterr().out
    for title in ("op forward, fp32", "op forward+backward, bf16", "model pvt:size=b0", "maxres"):
        assert title in printed
    for name in ("op_time.png", "op_memory.png", "model.png", "maxres.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    op = read_csv(tmp_path / "op.csv")
    for column in (
        "variant",
        "dtype",
        "mode",
        "tokens",
        "seconds",
        "floor_seconds",
        "floor_ratio",
        "peak_bytes",
    ):
        assert column in op[0]
    keys = {(r["variant"], r["dtype"], r["mode"], int(r["tokens"])) for r in op if r["status"] == "ok"}
    assert keys == {
        (v, d, m, n)
        for v in ("floor", "matmuls", "softmax", "flatten")
        for d in ("fp32", "bf16")
        for m in ("fwd", "fwdbwd")
        for n in (256, 1024)
    }
    for row in op:
        if row["variant"] == "matmuls":
            assert float(row["floor_ratio"]) > 0 and row["note"].endswith("GFLOP/s")
        elif row["variant"] != "floor":
            assert float(row["floor_ratio"]) > 0 and float(row["matmul_ratio"]) > 0
            # Every configuration got a peak from its memory child (a missing one is an empty cell). At
            # these tiny sizes the high-water mark may not rise above the child's baseline, so 0 is valid.
            assert row["peak_bytes"].isdigit(), (row["variant"], row["tokens"], row["peak_bytes"])
    assert all("vs_softmax" in r and r["vs_softmax"] for r in op if r["variant"] == "flatten")

    model = read_csv(tmp_path / "model.csv")
    assert {(r["model"], r["variant"]) for r in model if r["status"] == "ok"} == {
        (m, v) for m in ("pvt:size=b0", "vit:size=tiny") for v in ("softmax", "flatten")
    }
    assert all(float(r["images_per_s"]) > 0 and int(r["peak_bytes"]) > 0 for r in model)

    maxres = read_csv(tmp_path / "maxres.csv")
    assert {(r["variant"], r["checkpointing"]) for r in maxres} == {
        (v, c) for v in ("softmax", "flatten") for c in ("False", "True")
    }
    assert all(int(r["maxres"]) >= 64 and int(r["probes"]) >= 1 for r in maxres)
    probes = read_csv(tmp_path / "maxres_probes.csv")
    assert {"size", "status", "fits", "peak_bytes"} <= set(probes[0])


def test_bench_op_compile_times_a_compiled_twin_beside_each_variant(tmp_path):
    torch._dynamo.reset()
    args = ["grid=smoke", "device=cpu", "threads=1", "variants=[flatten]", "dtypes=[fp32]"]
    try:
        main(["op", *args, "modes=[fwd]", "memory=false", "compile=true", f"out={tmp_path}"])
    finally:
        torch._dynamo.reset()
    rows = {(r["variant"], int(r["tokens"])): r for r in read_csv(tmp_path / "op.csv")}
    for tokens in (256, 1024):
        for variant in ("flatten", "flatten+compile"):
            assert rows[variant, tokens]["status"] == "ok" and float(rows[variant, tokens]["seconds"]) > 0
