"""SegDataModule: metadata before setup, config checks, loaders and the padding collate."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from data_fixtures import H, W, make_folder, rgb, save

from segattn.data import SegDataModule, seg_collate
from segattn.doctor import compose_data_config

CONF_DATA = Path(__file__).resolve().parents[2] / "conf" / "data"
SMALL = {"crop_size": [8, 8], "ratio_range": [1.0, 1.0], "batch_size": 2}


def test_metadata_is_known_before_setup_and_without_files(tmp_path):
    dm = SegDataModule("camvid", root=tmp_path / "not-there", num_classes=11)
    assert dm.num_classes == 11 and dm.classes[0] == "sky" and dm.ignore_index == 255
    assert (
        dm.palette[3] == (128, 64, 128)
        and dm.mean == (0.485, 0.456, 0.406)
        and dm.std == (0.229, 0.224, 0.225)
    )


def test_num_classes_must_match_the_dataset(tmp_path):
    with pytest.raises(
        ValueError,
        match=r"data\.num_classes=12 but dataset 'camvid'.* has 11 classes.*set data\.num_classes=11",
    ):
        SegDataModule("camvid", root=tmp_path, num_classes=12)
    with pytest.raises(
        ValueError, match=r"num_classes=4 but dataset 'folder'.* has 3 classes \(road, tree, car\)"
    ):
        SegDataModule("folder", root=make_folder(tmp_path), num_classes=4)


def test_train_and_val_loaders(tmp_path):
    root = make_folder(tmp_path)
    save(root / "images" / "val" / "val01.png", rgb(0, H + 4, W - 6))  # a differently sized val image
    save(root / "masks" / "val" / "val01.png", torch.zeros(H + 4, W - 6, dtype=torch.uint8).numpy())
    dm = SegDataModule("folder", root=root, num_classes=3, val_batch_size=2, **SMALL)
    dm.setup("fit")
    train = next(iter(dm.train_dataloader()))
    assert (
        train["image"].shape == (2, 3, 8, 8) and train["mask"].dtype == torch.long and len(train["path"]) == 2
    )
    assert len(dm.train_dataloader()) == 1  # 3 samples, batch 2, last partial batch dropped
    val = next(iter(dm.val_dataloader()))
    assert val["image"].shape == (2, 3, H + 4, W) and val["path"][1].endswith("val01.png")
    assert (val["mask"][0, H:, :] == 255).all() and (val["mask"][1, :, W - 6 :] == 255).all()


def test_collate_pads_images_with_zero_and_masks_with_ignore():
    items = [
        {"image": torch.ones(3, 2, 5), "mask": torch.zeros(2, 5, dtype=torch.long), "path": "a"},
        {"image": torch.ones(3, 4, 3), "mask": torch.ones(4, 3, dtype=torch.long), "path": "b"},
    ]
    batch = seg_collate(items)
    assert batch["image"].shape == (2, 3, 4, 5) and batch["path"] == ["a", "b"]
    expected_mask = torch.tensor([[0, 0, 0, 0, 0], [0, 0, 0, 0, 0], [255] * 5, [255] * 5])
    assert torch.equal(batch["mask"][0], expected_mask)
    assert torch.equal(batch["mask"][1][:, 3:], torch.full((4, 2), 255))
    assert batch["image"][0, :, 2:].abs().sum() == 0 and batch["image"][1, :, :, 3:].abs().sum() == 0


def test_synthetic_default_config_runs_end_to_end():
    dm = SegDataModule(**compose_data_config([]))
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["image"].shape == (16, 3, 64, 64) and set(batch["mask"].unique().tolist()) <= {0, 1, 2, 3, 4}
    assert len(dm.datasets["train"]) == 384 and dm.num_classes == 5


@pytest.mark.parametrize("config", sorted(p.stem for p in CONF_DATA.glob("*.yaml")))
def test_every_data_config_builds_a_datamodule(tmp_path, config):
    overrides = [f"data={config}", f"data.root={tmp_path}"] if config != "synthetic" else []
    if config in ("folder", "raster"):  # both read their classes from the root's classes.json
        make_folder(tmp_path)
        overrides.append("data.num_classes=3")
    kwargs = compose_data_config(overrides)
    dm = SegDataModule(**kwargs)
    assert kwargs["name"] == config and dm.num_classes == kwargs["num_classes"]
