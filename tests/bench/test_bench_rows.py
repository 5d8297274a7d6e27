"""What a user runs, as rows of the bench tables (issue 31 item 5): the kernel path (SEGATTN_KERNEL) and
compile as row labels, non-square images and several batches in `bench model`, peak memory per megapixel
in the model and maxres tables, at least 5 timed repeats after the warm-up, `bench op`'s profiled
call (host and device time; on the CPU there is no device column to fill) and `bench model`'s profiled
step (self time per kernel, per op on the CPU).

At tiny sizes on the CPU: nothing here asserts speed.
"""

from __future__ import annotations

import csv
import os
import time
from pathlib import Path

import pytest
import torch

from segattn.bench.__main__ import main
from segattn.bench.graphs import GraphedCase, graphed
from segattn.bench.measure import MIN_REPEATS, interleaved_medians
from segattn.bench.op import OpSettings, build_variant, labelled_variants
from segattn.bench.specs import (
    format_image_size,
    kernel_path,
    parse_image_size,
    size_label,
    spec_of,
    with_compiled,
    with_kernels,
)
from segattn.layers import KERNEL_ENV

CPU = ["grid=smoke", "device=cpu", "threads=1"]


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


def test_image_sizes_are_a_side_or_width_x_height():
    assert parse_image_size("2048") == parse_image_size(2048) == (2048, 2048)
    assert parse_image_size("4288x2848") == (2848, 4288)  # IDRiD: 4288 wide, 2848 tall
    assert (format_image_size(2848, 4288), size_label(2848, 4288)) == ("4288×2848", "4288x2848")
    assert (format_image_size(64, 64), size_label(64, 64)) == ("64²", "64")
    for bad in ("4288x", "axb", "0x64"):
        with pytest.raises(ValueError, match="image"):
            parse_image_size(bad)


def test_bad_image_size_or_kernel_path_is_one_line(capsys):
    for argv in (["model", "image_sizes=[64x]"], ["maxres", "kernels=[cuda]"]):
        assert main([*argv, "grid=smoke"]) == 2
        error = capsys.readouterr().err
        assert error.count("\n") == 1 and argv[1].split("=")[0] in error


def test_kernel_paths_label_the_variants_that_have_a_triton_path():
    specs = [spec_of("linear"), spec_of("sra")]
    rows = with_kernels(specs, ["torch", "triton"])
    assert [(s.label, s.kernel) for s in rows] == [
        ("linear@torch", "torch"),
        ("linear@triton", "triton"),
        ("sra", "auto"),  # no Triton path: one row, as the environment says
    ]
    assert [s.label for s in with_kernels(specs, ["torch"])] == ["linear", "sra"]


def test_cuda_graphs_add_a_replayed_row_per_eager_variant():
    specs = [spec_of("linear"), spec_of("sra"), with_compiled([spec_of("linear")], True)[1]]
    settings = OpSettings(variants=specs, sizes=[1024], kernels=["torch", "triton"], cuda_graphs=True)
    labels = [label for label, _, _ in labelled_variants(settings)]
    eager = ["linear@torch", "linear@triton", "sra", "linear+compile"]
    assert labels == [*eager, *(label + "+graphs" for label in eager[:3])]  # compiled: no graphs twin
    assert graphed("linear", print) is print and isinstance(graphed("sra+graphs", print), GraphedCase)


def test_cuda_graphs_without_cuda_is_one_line(tmp_path, capsys):
    out = tmp_path / "results"
    assert main(["op", "grid=smoke", "device=cpu", "cuda_graphs=true", f"out={out}"]) == 2
    assert not out.exists()
    assert capsys.readouterr().err.strip() == (
        "python -m segattn.bench op: cuda_graphs=true: CUDA graphs need a CUDA device; this run is on cpu"
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kernel", ["torch", "triton"])
def test_a_replayed_graph_computes_what_the_eager_call_does(kernel):
    module = build_variant(spec_of("linear"), 64, 2, torch.device("cuda"), kernel)
    q, k, v = torch.randn(3, 2, 4096, 64, device="cuda").unbind(0)
    out = torch.empty(2, 4096, 64, device="cuda")

    def call():
        with torch.no_grad():
            out.copy_(module.mix_tokens(q, k, v, (64, 64)))

    case = GraphedCase(call)
    case()  # captures
    for x in (q, k, v):  # new values in the captured inputs: the replay reads them
        x.normal_()
    with torch.no_grad():
        expected = module.mix_tokens(q, k, v, (64, 64))
    case()
    torch.testing.assert_close(out, expected)


def test_kernel_path_sets_segattn_kernel_while_building_and_restores_it(monkeypatch):
    monkeypatch.delenv(KERNEL_ENV, raising=False)
    with kernel_path("torch"):
        assert os.environ[KERNEL_ENV] == "torch"
    assert KERNEL_ENV not in os.environ
    monkeypatch.setenv(KERNEL_ENV, "triton")
    with kernel_path("auto"):
        assert os.environ[KERNEL_ENV] == "triton"  # auto: as the environment says
    with kernel_path("torch"):
        assert os.environ[KERNEL_ENV] == "torch"
    assert os.environ[KERNEL_ENV] == "triton"


def test_a_call_slower_than_its_seconds_still_gets_the_minimum_repeats():
    calls = {"slow": lambda: time.sleep(2e-3)}
    device = torch.device("cpu")
    # The warm-up's 2 ms is 2000x the 1 µs given: before, that meant one timed sample.
    results = interleaved_medians(calls, device, repeats=20, warmup=2, config_seconds=1e-6)
    assert results["slow"][1] == MIN_REPEATS == 5
    assert interleaved_medians(calls, device, repeats=3, warmup=1, config_seconds=1e-6)["slow"][1] == 3


def test_bench_op_profiles_one_call_per_variant_with_at_least_5_repeats(tmp_path, capsys):
    args = [*CPU, "variants=[linear,softmax]", "dtypes=[fp32]", "modes=[fwd]"]
    assert main(["op", *args, "memory=false", f"out={tmp_path}"]) == 0
    assert "op profile: host and device time of one call" in capsys.readouterr().out
    assert all(int(row["repeats"]) >= 5 for row in read_csv(tmp_path / "op.csv"))
    profile = {row["variant"]: row for row in read_csv(tmp_path / "op_profile.csv")}
    assert set(profile) == {"linear", "softmax"}
    for row in profile.values():
        assert int(row["tokens"]) == 1024  # the largest size it ran at
        assert float(row["host_seconds"]) > 0 and int(row["ops"]) > 0
        assert row["device_seconds"] == ""  # no device on the CPU: the table says "cpu"


def test_bench_model_profiles_one_step_per_timed_row_at_the_profile_size(tmp_path, capsys):
    args = [*CPU, "models=[{name:pvt,size:b0}]", "variants=[linear]", "image_sizes=[32,64x32]", "repeats=1"]
    profile = ["profile=true", "profile_size=64x32"]
    assert main(["model", *args, "memory=false", *profile, f"out={tmp_path}"]) == 0
    assert "model profile: where a step spends its time" in capsys.readouterr().out
    rows = read_csv(tmp_path / "model_profile.csv")
    assert {(r["model"], r["size"], r["variant"], r["kernel"]) for r in rows} == {
        ("pvt:size=b0", "64x32", "linear", "auto")  # the profiled size only
    }
    assert len(rows) == 41 and rows[-1]["name"] == "other"  # the top 40 ops, then the rest
    times = [float(row["self_ms"]) for row in rows[:-1]]
    assert times == sorted(times, reverse=True) and times[0] > 0
    assert all(int(row["calls"]) >= 1 for row in rows)
    assert sum(float(row["share"]) for row in rows) == pytest.approx(1.0)


def test_a_profile_size_that_is_not_timed_is_one_line(tmp_path, capsys):
    argv = ["model", *CPU, "image_sizes=[32]", "profile=true", "profile_size=64", f"out={tmp_path / 'out'}"]
    assert main(argv) == 2
    error = "python -m segattn.bench model: profile_size=64: not one of image_sizes=[32]\n"
    assert capsys.readouterr().err == error
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_bench_model_rows_per_kernel_path_and_batch_with_peak_per_megapixel(tmp_path, capsys):
    # auto on the CPU is the PyTorch path, so both labels time (triton needs a GPU or the interpreter)
    args = [*CPU, "models=[{name:pvt,size:b0}]", "variants=[linear,sra]", "kernels=[torch,auto]"]
    main(["model", *args, "image_sizes=[64,96x64]", "batch=[1,2]", f"out={tmp_path}"])
    printed = capsys.readouterr().out
    assert "96×64" in printed and "linear@torch, batch 2" in printed and "/MP" in printed
    rows = read_csv(tmp_path / "model.csv")
    expected = {
        (variant, size, batch)
        for variant in ("linear@torch", "linear@auto", "sra")
        for size in ("64", "96x64")
        for batch in ("1", "2")
    }
    assert {(r["variant"], r["size"], r["batch"]) for r in rows if r["status"] == "ok"} == expected
    for row in rows:
        assert int(row["repeats"]) >= 5
        pixels = int(row["batch"]) * int(row["height"]) * int(row["width"])
        assert (int(row["height"]), int(row["width"])) == parse_image_size(row["size"])
        assert float(row["peak_bytes_per_mpx"]) == pytest.approx(int(row["peak_bytes"]) / (pixels / 1e6))


def test_bench_model_time_budget_skips_what_it_did_not_start_and_says_so(tmp_path):
    args = [*CPU, "models=[{name:pvt,size:b0}]", "variants=[linear]", "time_budget=1e-9"]
    assert main(["model", *args, f"out={tmp_path}"]) == 0
    rows = read_csv(tmp_path / "model.csv")
    assert rows and all(r["status"] == "skipped" and "time budget of 1e-09 s" in r["note"] for r in rows)


@pytest.mark.slow
def test_bench_model_compile_times_the_compiled_twin_after_compiling(tmp_path):
    torch._dynamo.reset()
    # A one-block ViT: inductor's C++ builds are nearly all of this test's time, and they grow with the graph.
    model = "models=[{name:vit,size:tiny,depth:1}]"
    args = [*CPU, model, "variants=[linear]", "compile=true", "memory=false"]
    try:
        main(["model", *args, f"out={tmp_path}"])
    finally:
        torch._dynamo.reset()
    rows = {r["variant"]: r for r in read_csv(tmp_path / "model.csv")}
    assert set(rows) == {"linear", "linear+compile"}
    assert all(r["status"] == "ok" and int(r["repeats"]) >= 5 for r in rows.values())


@pytest.mark.slow
def test_bench_maxres_rows_per_kernel_path_with_peak_per_megapixel(tmp_path, capsys):
    args = [*CPU, "variants=[flatten]", "kernels=[torch,auto]", "checkpointing=on"]
    main(["maxres", *args, f"out={tmp_path}"])
    assert "/MP at 64²" in capsys.readouterr().out
    rows = {r["variant"]: r for r in read_csv(tmp_path / "maxres.csv")}
    assert set(rows) == {"flatten@torch", "flatten@auto"}
    for row in rows.values():
        assert int(row["maxres"]) == 64 and float(row["peak_bytes_per_mpx"]) > 0
    probes = read_csv(tmp_path / "maxres_probes.csv")
    for probe in probes:
        expected = int(probe["peak_bytes"]) / (int(probe["size"]) ** 2 / 1e6)
        assert float(probe["peak_bytes_per_mpx"]) == pytest.approx(expected)
