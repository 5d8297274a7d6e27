"""Bad data end to end through training: each bad file planted by the data doctor's tests stops a real
training run with an error naming the file and what was expected, before any output is written with
``data.validate=true``, at the batch that reads the file otherwise. Grey/RGBA images and 16-bit masks
(documented conversions) train."""

from __future__ import annotations

import numpy as np
import pytest
from data_fixtures import H, W, label_grid, make_folder, rgb, save
from PIL import Image
from reliability_fixtures import RUN, VIT, compose_run, run_train
from test_data_doctor import PROBLEMS, corrupt_image, empty_split

from segattn.data import DataError
from segattn.training import run as train

FOLDER = [
    "data=folder",
    "data.num_classes=3",
    "data.crop_size=[12,16]",
    "data.ratio_range=[1.0,1.0]",
    "data.num_workers=0",
    "data.persistent_workers=false",
    "data.pin_memory=false",
    "data.val_batch_size=1",
    "trainer.max_steps=2",
]


def plant_in_training_split(problem, root) -> tuple[str, str, list[str]]:
    """Plant ``problem`` (a tests/data case) and train on the split holding the bad file, validating on a
    clean one: (bad path, expected message, overrides)."""
    path, message = problem(root)
    split = "test" if path == root else path.parent.name  # the empty split is 'test'
    clean = "val" if split == "train" else "train"
    return str(path), message, [f"data.root={root}", f"data.train_split={split}", f"data.val_split={clean}"]


@pytest.mark.parametrize("problem", PROBLEMS)
def test_validate_true_fails_before_any_output(tmp_path, monkeypatch, problem):
    path, message, data = plant_in_training_split(problem, make_folder(tmp_path / "data"))
    monkeypatch.setattr(train, "build_loggers", pytest.fail)  # fails before any W&B run or trainer
    cfg = compose_run(tmp_path, *RUN, *VIT, *FOLDER, *data, "data.validate=true", "logger=wandb")
    with pytest.raises(DataError) as error:
        train.run(cfg)
    assert path in str(error.value) and message in str(error.value)
    assert not (tmp_path / "run").exists()  # no checkpoints, no W&B files


@pytest.mark.parametrize("problem", PROBLEMS)
def test_without_validate_the_batch_reading_the_file_fails(tmp_path, problem):
    path, message, data = plant_in_training_split(problem, make_folder(tmp_path / "data"))
    cfg = compose_run(tmp_path, *RUN, *VIT, *FOLDER, *data, "logger=none")
    with pytest.raises(DataError) as error:
        train.run(cfg)
    assert path in str(error.value) and message in str(error.value)
    frames = {entry.name for entry in error.traceback}
    if problem is empty_split:  # found when the split is listed, before training
        assert "preflight" in frames
    else:  # raised inside Trainer.fit, by the dataset item that reads the file
        assert {"_run_stage", "__getitem__"} <= frames and "preflight" not in frames


def test_grey_rgba_images_and_16_bit_masks_train(tmp_path):
    root = make_folder(tmp_path / "data")
    save(root / "images/train/train00.png", rgb(1)[..., 0])  # grey: replicated to RGB
    rgba = np.dstack([rgb(2), np.full((H, W), 9, np.uint8)])
    save(root / "images/train/train01.png", rgba)  # alpha dropped
    Image.fromarray(label_grid([0, 1, 2, 255]).astype(np.uint16)).save(root / "masks/train/train02.png")
    data = [f"data.root={root}", "data.validate=true"]
    assert train.run(compose_run(tmp_path, *RUN, *VIT, *FOLDER, *data, "logger=none"))["steps"] == 2


@pytest.mark.slow
def test_train_py_reports_the_bad_file_and_exits_non_zero(tmp_path):
    path, message, data = plant_in_training_split(corrupt_image, make_folder(tmp_path / "data"))
    result = run_train(tmp_path, *RUN, *VIT, *FOLDER, *data, "data.validate=true", "logger=wandb")
    assert result.returncode == 1
    # one line (the commands' error boundary joins a report's lines): the count, the file and the problem
    found = f": data.validate found 1 problem(s) in dataset 'folder': - image {path} "
    assert found in result.stderr and message in result.stderr
    assert "Traceback" not in result.stderr  # the message, not a library traceback
    run_dir = tmp_path / "run"
    assert not (run_dir / "wandb").exists() and not (run_dir / "checkpoints").exists()
