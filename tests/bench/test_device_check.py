"""The device script and the IDRiD GPU arms it runs (issue 31 item 6, issue 32 item 4), checked without a
GPU: the scripts parse, and the arms of conf/experiment/idrid_gpu_whole.yaml train on whole images with
the pixels per step and the batches the issue asks for. The script's commands themselves run in its dry
run (`DRY_RUN=1 make device-check`, docs/performance.md "The device script"): minutes, not a test."""

from __future__ import annotations

import csv
import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from segattn.cli import compose_command

REPO = Path(__file__).resolve().parents[2]
ROOT = ["data.root=../shared/data/idrid"]  # composing does not read the folder
IDRID = (2848, 4288)  # height, width of every IDRiD photograph


@pytest.mark.parametrize("script", [".ci/device-check", ".ci/device-idrid"])
def test_the_device_scripts_parse(script):
    subprocess.run(["bash", "-n", str(REPO / script)], check=True)


def test_the_gpu_arms_are_whole_images_at_equal_pixels_or_equal_epochs():
    experiment = ["experiment=idrid_gpu_whole", *ROOT]
    params = compose_command("train", experiment, keep_hydra=True).hydra.sweeper.params
    assert params["+experiment/arms/idrid_gpu_whole"].split(",") == [
        "A-linear-full",
        "B-linear-x4-equal-time",
        "C-linear-x4-equal-epochs",
        "sra-full",
    ]
    arms = {
        label: compose_command("train", [*experiment, f"+experiment/arms/idrid_gpu_whole={label}"])
        for label in params["+experiment/arms/idrid_gpu_whole"].split(",")
    }

    def pixels_per_step(label: str) -> int:
        shrink, batch = arms[label].data.downsample, arms[label].data.batch_size
        return batch * (IDRID[0] // shrink) * (IDRID[1] // shrink)

    assert pixels_per_step("B-linear-x4-equal-time") == pixels_per_step("A-linear-full")  # 32 x 712x1072
    recipe = compose_command("train", experiment)
    assert arms["C-linear-x4-equal-epochs"].data.downsample == 4  # A's batch of 2
    assert arms["C-linear-x4-equal-epochs"].data.batch_size == recipe.data.batch_size == 2
    for label, cfg in arms.items():
        assert cfg.data.crop_size is None and cfg.inference.mode == "whole", label
        assert cfg.attention.name == ("sra" if label == "sra-full" else "linear")
        assert cfg.trainer.precision == "bf16-mixed" and cfg.trainer.accelerator == "gpu"


def test_the_summary_says_met_not_met_or_not_measured_per_target(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model.csv").write_text(
        "model,dtype,size,batch,variant,seconds,status,note\n"
        "pvt:size=b0,bf16,4096,1,linear@auto,0.05,ok,\n"
        "pvt:size=b0,bf16,4096,1,linear@torch,0.045,ok,\n"
        "pvt:size=b0,bf16,4096,1,linear@loss,0.0495,ok,\n"
        "pvt:size=b0,bf16,4096,1,linear@upsample,0.048,ok,\n"
        "pvt:size=b0,bf16,4096,1,linear@head,0.0505,ok,\n"
        "pvt:size=b0,bf16,4096,1,linear@ffn,0.047,ok,\n"
        "pvt:size=b0,bf16,4096,1,linear@residual,0.0492,ok,\n"
        "pvt:size=b0,bf16,4096,1,linear@triton,0.0625,ok,\n"
        "pvt:size=b0,bf16,4096,1,sra,0.2,ok,\n"
    )
    (tmp_path / "ratio").mkdir()
    (tmp_path / "ratio" / "model.csv").write_text(  # one kernel path: unlabelled
        "model,dtype,size,batch,variant,seconds,status,note\n"
        "pvt:size=b0,bf16,8192,1,linear,0.3,ok,\n"
        "pvt:size=b0,bf16,8192,1,sra,1.5,ok,\n"
    )
    (tmp_path / "maxres").mkdir()
    (tmp_path / "maxres" / "maxres.csv").write_text("model,variant,maxres,limited_by\npvt,linear,5120,oom\n")
    (tmp_path / "predict").mkdir()
    (tmp_path / "predict" / "predict.csv").write_text(
        "format,size,batch,num_workers,precision,scope,images_per_s,status,note\n"
        "torch,4288x2848,1,4,bf16,files,2.5,ok,\n"
        "torch,4288x2848,4,4,bf16,files,4.0,ok,\n"
        "torch,4288x2848,4,,bf16,network,,failed,CUDA out of memory\n"
    )
    (tmp_path / "steps.txt").write_text(
        "collect_tests: exit 0 after 9 s (limit 20 s)\ncuda_tests: exit 124 after 150 s (limit 150 s)\n"
        "op: exit 124 after 30 s (limit 30 s)\n"
    )
    (tmp_path / "collect_tests.log").write_text(
        "tests/a/test_ops.py::test_x[1]\ntests/a/test_ops.py::test_x[2]\ntests/a/test_ops.py::test_y\n"
        "tests/b/test_loss.py::test_z[a, b]\ntests/b/test_loss.py::test_z[a, c]\n"
        "tests/b/test_cut.py::test_1\ntests/b/test_cut.py::test_2\n"
        "tests/c/test_skip.py::test_gpu\ntests/c/test_skip.py::test_cpu\n\n10 tests collected in 3.1s\n"
    )
    (tmp_path / "cuda_tests.log").write_text(  # pytest -v under xdist, cut before its -rA summary
        "8 workers [10 items]\n"
        "[gw0] [ 11%] PASSED tests/a/test_ops.py::test_x[1] \n"
        "[gw1] [ 22%] PASSED tests/b/test_loss.py::test_z[a, b] \n"  # an id with spaces
        "[gw1] [ 25%] PASSED tests/b/test_loss.py::test_z[a, c] \n"
        "[gw0] [ 33%] FAILED tests/a/test_ops.py::test_x[2] \n"
        "[gw2] [ 44%] SKIPPED tests/c/test_skip.py::test_cpu \n"
        "[gw2] [ 55%] PASSED tests/c/test_skip.py::test_gpu \n"
        "[gw0] [ 66%] PASSED tests/a/test_ops.py::test_y \n"
        "[gw3] [ 77%] PASSED tests/b/test_cut.py::test_1 \n"
    )
    lines = subprocess.run(
        [sys.executable, str(REPO / ".ci/device-summary"), str(tmp_path)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    assert lines[0] == "pvt-b0 linear 4096² training step <= 60 ms: met (50.0 ms)"  # the auto row
    assert lines[1] == "linear >= 4x faster than sra at 8192²: met (5.00x: linear 0.300 s, sra 1.500 s)"
    assert lines[2] == (
        "one linear layer at 262144 tokens, forward+backward <= 1 ms: not measured: no linear 262144-token "
        "row (op: exit 124 after 30 s (limit 30 s))"
    )
    assert lines[3] == (
        "largest pvt-b0 linear image in the budget >= 6144²: not met (5120², linear, limited by oom)"
    )
    assert lines[4] == (
        "pvt-b0 linear 4096² training step by kernel path (a measurement, no target): auto 50.0 ms, "
        "torch 45.0 ms, loss 49.5 ms, upsample 48.0 ms, head 50.5 ms, ffn 47.0 ms, residual 49.2 ms, "
        "triton 62.5 ms"
    )
    criterion = "at 4096² (joins auto when >= 2% faster than auto in the same run)"
    assert lines[5] == f"opt-in loss {criterion}: stays opt-in (49.5 ms against 50.0 ms, +1.0%)"
    assert lines[6] == f"opt-in upsample {criterion}: joins auto (48.0 ms against 50.0 ms, +4.0%)"
    assert lines[7] == f"opt-in head {criterion}: stays opt-in (50.5 ms against 50.0 ms, -1.0%)"
    assert lines[8] == f"opt-in ffn {criterion}: joins auto (47.0 ms against 50.0 ms, +6.0%)"
    assert lines[9] == f"opt-in residual {criterion}: stays opt-in (49.2 ms against 50.0 ms, +1.6%)"
    assert lines[10:14] == [
        "CUDA tests tests/a/test_ops.py: failed (test_x[2])",
        "CUDA tests tests/b/test_loss.py: passed",
        "CUDA tests tests/b/test_cut.py: not finished: 1 of 2 tests reported before the cut",
        "CUDA tests tests/c/test_skip.py: passed (1 skipped)",
    ]
    assert lines[-2] == (
        "predict pvt-b0 bf16, JPEG files to PNG masks >= 10 images/s (issue 40): not met (4.0 images/s at "
        "4288x2848, batch 4, 4 workers)"
    )
    assert lines[-1] == (
        "predict pvt-b0 bf16, the network alone >= 30 images/s (issue 40): failed: CUDA out of memory"
    )


def test_the_summary_says_why_the_cuda_tests_did_not_run(tmp_path):
    (tmp_path / "steps.txt").write_text("collect_tests: not run, 5 s left of the 480 s deadline\n")
    summary = [sys.executable, str(REPO / ".ci/device-summary"), str(tmp_path)]
    lines = subprocess.run(summary, check=True, capture_output=True, text=True).stdout.splitlines()
    assert "CUDA tests: not run (collect_tests: not run, 5 s left of the 480 s deadline)" in lines
    assert lines[0] == (
        "pvt-b0 linear 4096² training step <= 60 ms: not measured: no linear 4096² row (model: not run)"
    )


@pytest.mark.slow
def test_the_dry_run_measures_and_judges_every_benchmark_target(tmp_path):
    """The device script's CPU form at tiny sizes, its benchmark steps and the CUDA tests' collection: each
    writes its rows and the summary judges each target from them (met or not met, never 'not measured'),
    gives the step on each kernel path with each opt-in form's verdict, and a line per test file,
    collected."""
    only = "collect_tests,cuda_tests,model,ratio,op,maxres"
    env = {**os.environ, "DRY_RUN": "1", "ONLY": only, "RESULTS": str(tmp_path)}
    subprocess.run(
        ["bash", str(REPO / ".ci/device-check")], check=True, env=env, capture_output=True, timeout=900
    )
    steps = (tmp_path / "steps.txt").read_text()
    for step in only.split(","):
        assert f"{step}: exit 0 " in steps, steps
    summary = (tmp_path / "summary.txt").read_text().splitlines()
    assert len([line for line in summary[:4] if ": met (" in line or ": not met (" in line]) == 4, summary
    paths = r".*by kernel path .*: auto [\d.]+ ms, loss [\d.]+ ms, upsample [\d.]+ ms, head [\d.]+ ms, "
    paths += r"ffn [\d.]+ ms, residual [\d.]+ ms, torch [\d.]+ ms"  # the device adds triton
    assert re.fullmatch(paths, summary[4]), summary
    verdicts = [line for line in summary if line.startswith("opt-in ")]
    for verdict, name in zip(verdicts, ("loss", "upsample", "head", "ffn", "residual"), strict=True):
        assert re.fullmatch(rf"opt-in {name} .*: (joins auto|stays opt-in) \(.*\)", verdict), summary
    tests = [line for line in summary if line.startswith("CUDA tests ")]
    assert len(tests) == 14, tests
    assert all(re.search(r": collected, not run \(\d+ tests\)$", line) for line in tests), tests
    with (tmp_path / "model/model_profile.csv").open() as profile:
        profiled = {row["size"] for row in csv.DictReader(profile)}
    assert profiled == {"64"}  # the step size only
    assert json.loads((tmp_path / "environment.json").read_text())["project_pins"]["torch"] == "2.14.1"


def test_the_summary_judges_the_opt_in_forms_fast_path_has():
    """.ci/device-summary runs without segattn installed, so it keeps its own copy of ``OPT_IN``."""
    from segattn.layers.fast_path import OPT_IN

    assert runpy.run_path(str(REPO / ".ci/device-summary"))["OPT_IN"] == OPT_IN
