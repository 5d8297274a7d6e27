"""python -m segattn.bench predict: with no checkpoint it exports a random pvt-b0 as safetensors and ONNX and
writes a row per format, batch and scope (files on disk to masks on disk, and the network alone); bad keys
are one line, status 2, before anything is written. Nothing here asserts speed."""

from __future__ import annotations

import csv

import pytest

from segattn.bench.__main__ import main

PROG = "python -m segattn.bench predict"


def test_predict_bench_writes_torch_and_onnx_rows_for_files_and_network(tmp_path, capsys):
    argv = ["predict", "grid=smoke", "device=cpu", "threads=1", "image_sizes=[64x48]", "batch=[2]"]
    assert main([*argv, "images=3", f"out={tmp_path}"]) == 0
    rows = list(csv.DictReader((tmp_path / "predict.csv").open()))
    assert [(row["format"], row["scope"], row["num_workers"]) for row in rows] == [
        ("torch", "network", ""),
        ("torch", "files", "0"),
        ("onnx", "network", ""),
        ("onnx", "files", "0"),
    ]
    for row in rows:
        assert row["status"] == "ok" and row["size"] == "64x48" and row["repeats"] == "5", row
        assert row["overlays"] == ("True" if row["scope"] == "files" else ""), row
        images_per_s = float(row["images_per_s"])
        assert images_per_s > 0 and int(row["peak_bytes"]) > 0
        assert float(row["megapixels_per_s"]) == pytest.approx(images_per_s * 64 * 48 / 1e6)
        count = 3 if row["scope"] == "files" else 2  # the files of a pass, or one batch
        assert float(row["seconds"]) == pytest.approx(count / images_per_s)
    out = capsys.readouterr().out
    assert "no checkpoint given: a pvt-b0" in out and "predict throughput" in out


def test_predict_bench_times_the_masks_alone_with_overlays_false(tmp_path, capsys):
    argv = ["predict", "grid=smoke", "device=cpu", "threads=1", "image_sizes=[64x48]", "batch=[1]"]
    assert main([*argv, "formats=[torch]", "images=2", "overlays=false", f"out={tmp_path}"]) == 0
    rows = list(csv.DictReader((tmp_path / "predict.csv").open()))
    assert [(row["scope"], row["overlays"], row["status"]) for row in rows] == [
        ("network", "", "ok"),
        ("files", "False", "ok"),
    ]
    out = capsys.readouterr().out
    assert "exported as safetensors to" in out and "JPEG files to PNG masks a pass" in out


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["repeats=3"], "repeats=3: expected an integer >= 5"),
        (["formats=[torch,tensorrt]"], "formats=['torch', 'tensorrt']: expected a list of torch, onnx"),
        (["precisions=[fp16]"], "inference.precision=fp16 on device=cpu: half precision runs on a CUDA"),
        (["num_workers=[-1]"], "num_workers=[-1]: expected a list of integers >= 0"),
        (["checkpoint=no/such.ckpt"], "checkpoint=no/such.ckpt: no such file or directory"),
    ],
)
def test_a_bad_predict_bench_key_is_one_line_before_any_output(argv, expected, tmp_path, capsys):
    out = tmp_path / "results"
    assert main(["predict", *argv, "grid=smoke", "device=cpu", f"out={out}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"{PROG}: {expected}"), err
    assert not out.exists()
