"""``train.py data.crop_size=null``: one step on whole images of a tiny folder dataset, padded to the model's
stride, validated and tested on whole images; a training split of mixed sizes is refused before any output."""

from __future__ import annotations

import pytest
from data_fixtures import H, W, label_grid, make_folder, rgb, save
from train_overrides import QUIET, TINY_MODEL, compose_config

from segattn.evaluation.command import run as evaluate
from segattn.training.module import SegmentationModule
from segattn.training.run import run

WHOLE = [
    *QUIET,
    *TINY_MODEL["pvt"],
    "data=folder",
    "data.crop_size=null",
    "data.batch_size=2",
    "data.val_batch_size=2",
    "data.num_workers=0",
    "data.persistent_workers=false",
    "data.pin_memory=false",
    "logger=none",
    "trainer.max_steps=1",
    "trainer.num_sanity_val_steps=0",
    "scheduler.warmup_steps=0",
]


def test_one_step_on_whole_images(tmp_path, train_config, monkeypatch):
    root = make_folder(tmp_path / "ds", {"train": 2, "val": 2, "test": 2})
    shapes = []
    step = SegmentationModule.training_step

    def recording_step(self, batch, batch_idx):
        shapes.append((tuple(batch["image"].shape), tuple(batch["mask"].shape)))
        return step(self, batch, batch_idx)

    monkeypatch.setattr(SegmentationModule, "training_step", recording_step)
    summary = run(train_config(*WHOLE, f"data.root={root}"))
    assert shapes == [((2, 3, 32, 32), (2, 32, 32))]  # 12x16 images padded to pvt's stride 32
    assert summary["test_note"].startswith("2 images of split 'test'")
    assert set(summary["test"]["IoU"]) == {"road", "tree", "car"}
    # eval.py reads the recorded data config (crop_size null) and scores whole images as validation did
    out = tmp_path / "eval"
    checkpoint = summary["last_checkpoint"]
    overrides = [f"paths.log_dir={out}", f"paths.output_dir={out}", f"checkpoint={checkpoint}", "split=val"]
    payload = evaluate(compose_config(overrides, "eval"))
    assert payload["summary"]["mIoU"] == summary["final"]["mIoU"] and payload["images"] == 2


def test_mixed_sizes_are_refused_before_training(tmp_path, train_config):
    root = make_folder(tmp_path / "ds", {"train": 2, "val": 1})
    save(root / "images" / "train" / "odd.png", rgb(7, H + 8, W))
    save(root / "masks" / "train" / "odd.png", label_grid([0, 1], H + 8, W))
    with pytest.raises(
        ValueError, match=r"^data\.crop_size=null with data\.batch_size=2: .*\[20, 16\] \(1, e\.g\."
    ):
        run(train_config(*WHOLE, f"data.root={root}"))
    assert not (tmp_path / "run" / "checkpoints").exists()
