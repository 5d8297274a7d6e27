"""eval.py on a tiny trained checkpoint: the same scores as the validation loop on the same split and mode,
its ONNX export within 0.1 mIoU, the report files, and bad inputs refused with one line naming them."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from train_overrides import QUIET, REPO, TINY_DATA, TINY_MODEL, compose_config
from warm_processes import run as run_command

from segattn.evaluation.average_precision import average_precision_from_histograms
from segattn.evaluation.command import run as evaluate
from segattn.export import main as export_main
from segattn.training.run import run as train

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A tiny PVT trained two epochs on synthetic data (4 val and 4 test images of 32x32)."""
    root = tmp_path_factory.mktemp("trained")
    cfg = compose_config(
        [
            f"paths.log_dir={root}",
            f"paths.output_dir={root / 'run'}",
            *TINY_DATA,
            *TINY_MODEL["pvt"],
            *QUIET,
            "attention=linear",
            "logger=none",
            "callbacks.wandb_panel=null",
            "trainer.max_epochs=2",
            "trainer.num_sanity_val_steps=0",
            "test_last=true",
        ]
    )
    return train(cfg) | {"root": root}


def eval_config(out: Path, *overrides: str):
    return compose_config([f"paths.log_dir={out}", f"paths.output_dir={out}", *overrides], "eval")


def same_scores(a: dict, b: dict) -> bool:
    return all(
        (math.isnan(x) and math.isnan(y)) or x == y for x, y in zip(a.values(), b.values(), strict=True)
    )


def test_eval_reproduces_the_validation_loop_and_writes_its_report(trained, tmp_path):
    """The last validation scored the last checkpoint's weights on 'val', whole-image: so must eval."""
    payload = evaluate(eval_config(tmp_path, f"checkpoint={trained['last_checkpoint']}", "split=val"))
    final = trained["final"]
    assert payload["summary"]["mIoU"] == final["mIoU"]
    assert payload["summary"]["aAcc"] == final["aAcc"]
    assert payload["summary"]["mAP"] == final["mAP"]  # the same probability histograms
    iou = {name: math.nan if v["IoU"] is None else v["IoU"] for name, v in payload["per_class"].items()}
    assert same_scores(iou, final["IoU"])
    # The dataset came from the checkpoint: synthetic at 32x32 with its 4 val images, not the defaults.
    assert (payload["dataset"], payload["images"]) == ("synthetic", 4)
    for name in ("metrics.json", "per_class.csv", "confusion.png", "examples.png"):
        assert (tmp_path / name).is_file(), name
    assert json.loads((tmp_path / "metrics.json").read_text())["inference"]["mode"] == "whole"


def test_eval_on_the_cpu_in_batches_keeps_the_validation_scores(trained, tmp_path):
    """device=cpu and four whole images per forward pass: the scores of the last validation, unchanged."""
    overrides = ("device=cpu", "inference.batch_size=4", "inference.precision=fp32", "split=val")
    payload = evaluate(eval_config(tmp_path, f"checkpoint={trained['last_checkpoint']}", *overrides))
    assert (payload["summary"]["mIoU"], payload["summary"]["mAP"]) == (
        trained["final"]["mIoU"],
        trained["final"]["mAP"],
    )


def test_eval_in_two_processes_sums_to_the_scores_of_one(trained, tmp_path):
    """devices=2: a spawned process scores every other image; its confusion counts and AP histograms add
    up to exactly what one process counts (4 val images: shares of 2 and 2)."""
    checkpoint = f"checkpoint={trained['last_checkpoint']}"
    one = evaluate(eval_config(tmp_path / "one", checkpoint, "split=val", "device=cpu"))
    two = evaluate(eval_config(tmp_path / "two", checkpoint, "split=val", "device=cpu", "devices=2"))
    assert two["confusion"] == one["confusion"] and two["images"] == one["images"] == 4
    assert two["summary"] == one["summary"]


def test_eval_of_the_test_split_matches_test_after_fit(trained, tmp_path):
    payload = evaluate(eval_config(tmp_path, f"checkpoint={trained['best_checkpoint']}"))
    assert payload["split"] == "test"
    assert payload["summary"]["mIoU"] == trained["test"]["mIoU"]


def test_test_last_scores_the_final_weights_and_keeps_the_ap_histograms(trained, tmp_path):
    """``test_last=true``: the final weights are tested too (what eval.py gives for last.ckpt), and each
    test's AP histograms are saved, from which its AP is recomputed without the model."""
    payload = evaluate(eval_config(tmp_path, f"checkpoint={trained['last_checkpoint']}"))
    assert payload["summary"]["mIoU"] == trained["test_last"]["mIoU"]
    assert payload["summary"]["mAP"] == pytest.approx(trained["test_last"]["mAP"], abs=1e-9)
    run_dir = trained["root"] / "run"
    for which in ("best", "last"):
        saved = np.load(run_dir / f"test_ap_{which}.npz")
        ap = average_precision_from_histograms(
            torch.from_numpy(saved["positives"]), torch.from_numpy(saved["negatives"])
        )
        expected = trained["test" if which == "best" else "test_last"]["AP"]
        assert ap.tolist() == pytest.approx(list(expected.values()), nan_ok=True)


def test_onnx_export_scores_within_a_tenth_of_a_point(trained, tmp_path):
    out = tmp_path / "onnx"
    checkpoint = trained["best_checkpoint"]
    assert (
        export_main([f"checkpoint={checkpoint}", "format=onnx", f"out={out}", "height=32", "width=32"]) == 0
    )
    scored = {}
    for kind, path in (("ckpt", checkpoint), ("onnx", out / "model.onnx")):
        payload = evaluate(eval_config(tmp_path / kind, f"checkpoint={path}", "inference.flip=true"))
        scored[kind] = payload["summary"]["mIoU"]
        assert payload["format"] == ("checkpoint" if kind == "ckpt" else "onnx")
    assert abs(scored["ckpt"] - scored["onnx"]) <= 0.1, scored

    bare = tmp_path / "bare.onnx"  # the same graph without segattn's metadata
    model = onnx.load(out / "model.onnx")
    del model.metadata_props[:]
    onnx.save(model, bare)
    with pytest.raises(ValueError, match=r"bare.onnx: no 'segattn' metadata"):
        evaluate(eval_config(tmp_path / "bare", f"checkpoint={bare}"))


def test_a_torchscript_export_scores_as_its_checkpoint(trained, tmp_path):
    """eval.py checkpoint=<model.pt>: the traced model through the same torch inference as the checkpoint."""
    out = tmp_path / "ts"
    checkpoint = trained["best_checkpoint"]
    args = [f"checkpoint={checkpoint}", "format=torchscript", f"out={out}", "height=32", "width=32"]
    assert export_main(args) == 0
    scored = {}
    for kind, path in (("checkpoint", checkpoint), ("torchscript", out / "model.pt")):
        payload = evaluate(eval_config(tmp_path / kind, f"checkpoint={path}", "inference.flip=true"))
        scored[kind] = payload["summary"]["mIoU"]
        assert payload["format"] == kind
    assert abs(scored["checkpoint"] - scored["torchscript"]) <= 0.1, scored


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["split=holdout"], "split='holdout': synthetic has splits ['train', 'val', 'test'], not 'holdout'"),
        (["data=camvid", "data.root=."], "predicts 5 classes but dataset 'camvid' has 11 (sky, building,"),
        (["inference.mode=tiles"], "inference.mode='tiles': expected one of whole, slide"),
        (["device=cpu", "devices=0"], "devices=0: expected an integer >= 1"),
        (["device=cuda:1"] if not torch.cuda.is_available() else ["device=cuda:99"], "CUDA device"),
        (
            ["device=cpu", "inference.precision=fp16"],
            "inference.precision=fp16 on device=cpu: half precision",
        ),
    ],
)
def test_bad_inputs_name_the_value(trained, tmp_path, overrides, message):
    cfg = eval_config(tmp_path / "out", f"checkpoint={trained['best_checkpoint']}", *overrides)
    with pytest.raises(ValueError) as error:
        evaluate(cfg)
    assert message in str(error.value)
    assert not (tmp_path / "out").exists()


def test_cli_reports_a_missing_checkpoint_in_one_line(tmp_path):
    result = run_command(
        [
            sys.executable,
            str(REPO / "eval.py"),
            f"checkpoint={tmp_path / 'missing.ckpt'}",
            f"paths.log_dir={tmp_path}",
        ],
        cwd=REPO,
        env=dict(os.environ),
        timeout=120,
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"eval.py: checkpoint={tmp_path / 'missing.ckpt'}: no such file or directory; expected a train.py "
        ".ckpt, an exported safetensors directory, a model.onnx or a TorchScript model.pt"
    ]
    assert not (tmp_path / "evals").exists() or not any((tmp_path / "evals").iterdir())


def test_training_without_a_test_split_says_so(tmp_path):
    cfg = compose_config(
        [
            f"paths.log_dir={tmp_path}",
            f"paths.output_dir={tmp_path / 'run'}",
            *TINY_DATA,
            *TINY_MODEL["pvt"],
            *QUIET,
            "data.num_test=0",
            "attention=linear",
            "logger=none",
            "callbacks.wandb_panel=null",
            "trainer.max_epochs=1",
            "trainer.num_sanity_val_steps=0",
        ]
    )
    summary = train(cfg)
    assert summary["test"] == {} and summary["test_note"] == "test split 'test' is empty"
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["test_note"] == summary["test_note"]
