"""tools/accuracy_table.py, the summary of an accuracy study's runs: the average-precision report (the
per-class tables and the AP-against-scale plot) from run rows, and the tables of a sweep folder."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from accuracy_table import main, markdown, plot_resolution, summarize

PNG = b"\x89PNG\r\n\x1a\n"


def run_row(variant: str, seed: int, ap: float) -> dict:
    attention, _, shrink = variant.partition("-x")
    return {
        "variant": variant, "seed": seed, "attention": attention, "downsample": int(shrink or 1),
        "status": "ok", "test_mIoU": 40.0 + seed, "test_mAcc": 50.0,
        "test_mAP": ap, "monitor": "val/mAP", "train_seconds": 600.0,
        "test_AP_microaneurysms": ap / 2, "test_AP_haemorrhages": ap, "test_IoU_microaneurysms": 5.0,
    }  # fmt: skip


def test_average_precision_tables_and_resolution_plot(tmp_path: Path):
    runs = [run_row("flatten", s, 30.0 + s) for s in (0, 1)] + [run_row("flatten-x4", 0, 20.0)]
    runs.append(run_row("sra", 0, float("nan")) | {"test_AP_haemorrhages": float("nan")})
    table = summarize(runs, {"flatten": {"step_seconds": 0.6, "peak_bytes": 2**30}})
    flatten = table[0]
    assert (flatten["test_mAP_mean"], round(flatten["test_mAP_std"], 3)) == (30.5, 0.707)
    assert flatten["test_AP_microaneurysms_mean"] == 15.25 and table[1]["downsample"] == 4
    assert table[2]["test_AP_haemorrhages_mean"] is None  # NaN runs are left out of means
    text = markdown(table, "not measured")
    ap_table, iou_table = text.split("\n\n")
    assert ap_table.splitlines()[0].startswith("| arm | test mAP (mean ± std) | runs | AP microaneurysms |")
    assert (
        "| `flatten` | 30.50 ± 0.71 | 30.00 31.00 | 15.25 | 30.50 | 40.50 | 600 ms | 1 GiB | 10.00 |"
        in ap_table
    )
    assert iou_table.splitlines()[2] == "| `flatten` | 5.00 |"
    plot_resolution(table, tmp_path / "resolution.png", "test")
    assert (tmp_path / "resolution.png").read_bytes()[:8] == PNG


def test_runs_that_tested_their_final_weights_get_a_column_for_it():
    runs = [run_row("linear", s, 30.0 + s) | {"test_last_mAP": 20.0 + s} for s in (0, 1)]
    table = summarize(runs, {})
    assert table[0]["test_last_mAP_mean"] == 20.5
    header, _, row = markdown(table, "not measured").split("\n\n")[0].splitlines()[:3]
    assert header.startswith("| arm | test mAP (mean ± std) | runs | final weights' mAP | AP microaneurysms")
    assert row.startswith("| `linear` | 30.50 ± 0.71 | 30.00 31.00 | 20.50 | 15.25 |")


def write_run(runs: Path, name: str, miou: float | None, attention: str = "linear") -> None:
    """A run folder as ``train.py -m`` leaves it: its composed config and, once tested, summary.json."""
    (runs / name / ".hydra").mkdir(parents=True)
    (runs / name / ".hydra" / "config.yaml").write_text(f"attention: {{name: {attention}}}\ndata: {{}}\n")
    if miou is not None:
        scores = {"mIoU": miou, "mAcc": 50.0, "aAcc": 90.0}
        summary = {"steps": 2, "best_mIoU": miou, "test": scores}
        (runs / name / "summary.json").write_text(json.dumps(summary))


def test_a_sweep_folder_is_tabled_in_the_sweeps_order_of_arms(tmp_path: Path, capsys):
    """Runs without test scores (training, failed) and other folders are left out; the costs of
    OUT/costs.json fill the cost columns."""
    runs, out = tmp_path / "runs", tmp_path / "out"
    for name, miou in [
        ("sra-seed0", 30.0),
        ("linear-seed0", 40.0),
        ("linear-seed1", 42.0),
        ("sra-seed1", None),
    ]:
        write_run(runs, name, miou, name.split("-")[0])
    (runs / "notes").mkdir()
    params = "{+experiment/arms/smoke: 'sra,linear', seed: '0,1'}"
    (runs / "multirun.yaml").write_text(f"hydra:\n  sweeper:\n    params: {params}\n")
    out.mkdir()
    costs = {"settings": {"maxres_budget_gib": 2.0}, "steps": {"linear": {"step_seconds": 0.2}}}
    (out / "costs.json").write_text(json.dumps(costs | {"maxres": {}}))
    assert main([str(runs), str(out)]) == 0
    with (out / "accuracy_table.csv").open(newline="") as handle:
        table = list(csv.DictReader(handle))
    assert [(row["variant"], row["seeds"]) for row in table] == [("sra", "1"), ("linear", "2")]
    assert float(table[1]["test_mIoU_mean"]) == 41.0 and float(table[1]["step_seconds"]) == 0.2
    lines = (out / "accuracy.md").read_text().splitlines()
    assert lines[0].endswith("| largest image, batch 1, 2 GiB |")
    assert lines[3] == "| `linear` | 41.00 ± 1.41 | 40.00 42.00 | 200 ms | - | - |"
    assert (out / "accuracy.png").read_bytes()[:8] == PNG
    assert "accuracy" in capsys.readouterr().out


def test_a_folder_without_finished_runs_is_one_line_and_status_2(tmp_path: Path, capsys):
    write_run(tmp_path, "linear-seed0", None)
    assert main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"accuracy_table: {tmp_path}: no <arm>-seed<seed> run with test scores"
    )
    assert not (tmp_path.parent / "accuracy.csv").exists()


@pytest.mark.slow
def test_the_smoke_study_trains_each_arm_through_train_py_and_tables_it(tmp_path: Path, capsys):
    """``train.py -m experiment=accuracy_smoke``: two arms trained and tested, one folder each
    (``<arm>-seed<seed>``); the summary tables them in the sweep's order."""
    runs = tmp_path / "runs"
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(repo)}
    command = [
        sys.executable,
        str(repo / "train.py"),
        "-m",
        "experiment=accuracy_smoke",
        f"hydra.sweep.dir={runs}",
    ]
    subprocess.run(command, cwd=tmp_path, env=env, check=True, capture_output=True)
    assert main([str(runs)]) == 0
    with (tmp_path / "accuracy.csv").open(newline="") as handle:
        rows = {row["variant"]: row for row in csv.DictReader(handle)}
    assert set(rows) == {"sra", "linear"} and all(row["status"] == "ok" for row in rows.values())
    assert all(0 <= float(row["test_mIoU"]) <= 100 and int(row["steps"]) == 2 for row in rows.values())
    assert {row["attention"] for row in rows.values()} == {"sra", "linear"}
    markdown = (tmp_path / "accuracy.md").read_text().splitlines()
    assert [line.split("|")[1].strip() for line in markdown[2:]] == ["`sra`", "`linear`"]
    assert (tmp_path / "accuracy.png").read_bytes()[:8] == PNG
