"""A model trained and validated on images shrunk by data.downsample, with average precision as the
checkpoint's monitor: eval.py scores it as validation did, at the masks' full resolution, and
``TrainedModel.predict`` (what segattn.predict runs) gives the masks eval.py scores."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from data_fixtures import make_folder, save
from train_overrides import QUIET, TINY_MODEL, compose_config

import segattn
from segattn.evaluation.command import run as evaluate
from segattn.evaluation.metrics import SegmentationMetric
from segattn.images import read_mask
from segattn.training.run import run as train

pytestmark = pytest.mark.slow


def test_reduced_resolution_run_is_scored_at_full_resolution(tmp_path):
    root = make_folder(tmp_path / "ds", {"train": 2, "val": 2, "test": 1})
    rng = np.random.default_rng(0)
    for split, count in (("train", 2), ("val", 2), ("test", 1)):
        for i in range(count):
            mask = np.zeros((64, 96), dtype=np.uint8)
            mask[8 * i : 8 * i + 5, 40:45] = 2
            mask[30:, :20] = 1
            save(root / "images" / split / f"{split}{i:02d}.png", rng.integers(0, 256, (64, 96, 3), np.uint8))
            save(root / "masks" / split / f"{split}{i:02d}.png", mask)
    data = [
        "data=folder", f"data.root={root}", "data.cache_dir=" + str(tmp_path / "cache"),
        "data.downsample=2", "+data.foreground_prob=0.5", "data.crop_size=[32,32]", "data.batch_size=2",
        "data.num_workers=0", "data.persistent_workers=false", "data.pin_memory=false",
    ]  # fmt: skip
    run = [
        f"paths.log_dir={tmp_path}", f"paths.output_dir={tmp_path / 'run'}", *data,
        *TINY_MODEL["pvt"], *QUIET, "attention=linear", "logger=none", "callbacks.wandb_panel=null",
        "trainer.max_epochs=2", "trainer.num_sanity_val_steps=0", "metrics.ap_mean_classes=[car]",
        "callbacks.model_checkpoint.monitor=val/mAP",
    ]  # fmt: skip
    summary = train(compose_config(run))
    assert summary["monitor"] == "val/mAP" and summary["best_mIoU"] is None
    assert summary["best_score"] >= summary["final"]["mAP"] - 1e-5  # float32 as logged
    assert summary["final"]["mAP"] == summary["final"]["AP"]["car"]  # the mean over the one class asked
    scoring = [
        f"paths.log_dir={tmp_path}", f"paths.output_dir={tmp_path / 'eval'}",
        f"checkpoint={summary['last_checkpoint']}", "split=val", "metrics.ap_mean_classes=[car]",
    ]  # fmt: skip
    payload = evaluate(compose_config(scoring, "eval"))
    assert payload["summary"]["mIoU"] == summary["final"]["mIoU"]
    assert payload["summary"]["mAP"] == summary["final"]["mAP"]
    assert payload["per_class"]["car"]["AP"] == summary["final"]["AP"]["car"]
    pixels = sum(values["pixels"] for values in payload["per_class"].values())
    assert pixels == 2 * 64 * 96  # scored against the full-resolution masks

    # predict reads the recorded shrink: the full-resolution files in, the masks eval.py scored out
    model = segattn.open_model(summary["last_checkpoint"])
    assert model.downsample == 2
    metric = SegmentationMetric(3)
    for i in range(2):
        ids = model.predict(root / "images" / "val" / f"val{i:02d}.png")
        assert ids.shape == (64, 96)
        metric.update(
            torch.from_numpy(ids).long(),
            torch.from_numpy(read_mask(root / "masks" / "val" / f"val{i:02d}.png")).long(),
        )
    assert metric.compute()["mIoU"].item() == pytest.approx(payload["summary"]["mIoU"], abs=1e-9)
    with pytest.raises(ValueError, match=r"data.downsample=2 \(recorded in .*\): the image is 95x64"):
        model.predict(np.zeros((64, 95, 3), np.uint8))

    # The two-line Python API of docs/inference.md, from a fresh interpreter
    code = (
        "import numpy as np, segattn; "
        f"model = segattn.open_model({str(summary['last_checkpoint'])!r}); "
        "ids, probs = model.predict(np.zeros((64, 96, 3), np.uint8), probabilities=True); "
        "from segattn.inference.infer import infer; "
        "print(ids.shape, ids.dtype, probs.shape, callable(infer))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert result.stdout.strip() == "(64, 96) uint8 (3, 64, 96) True", result.stderr[-2000:]
