"""Whole images as training samples (``data.crop_size=null``): no scale or crop, batches padded to the
model's stride (image 0, mask ignore), mixed sizes refused in one line, folder datasets read at
``data.downsample`` shrunk first, and one IDRiD image at 1/8 where the team's copy is present."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from data_fixtures import H, W, label_grid, make_folder, rgb, save
from PIL import Image

from segattn.data import SegDataModule
from segattn.data.datamodule import whole_image_collate
from segattn.data.decoded import shrink_mask
from segattn.images import IMAGENET_MEAN, IMAGENET_STD
from segattn.training.preflight import check_crop_at_shrink, train_sizes

IDRID = Path(__file__).resolve().parents[3] / "shared" / "data" / "idrid"
STRIDE = 32  # pvt's output stride: what the training run sets as the datamodule's size_divisor
LOADER = {"num_workers": 0, "persistent_workers": False, "pin_memory": False}


def whole_module(root: Path, **options) -> SegDataModule:
    settings = {"crop_size": None, "batch_size": 2, "size_divisor": STRIDE, **LOADER, **options}
    return SegDataModule("folder", root=root, **settings)


def normalised(path: Path) -> torch.Tensor:
    """The file's pixels as RGB/255 normalised by the ImageNet statistics: [3, H, W]."""
    pixels = np.asarray(Image.open(path).convert("RGB"), dtype=np.float64) / 255.0
    values = (pixels - np.array(IMAGENET_MEAN)) / np.array(IMAGENET_STD)
    return torch.from_numpy(values.transpose(2, 0, 1)).float()


def test_whole_image_batch_is_padded_to_the_stride_with_zero_and_ignore(tmp_path):
    root = make_folder(tmp_path, {"train": 2, "val": 1})
    datamodule = whole_module(root, hflip=0.0, photometric=False)  # ratio_range [0.5, 2] unused
    batch = next(iter(datamodule.train_dataloader()))
    assert batch["image"].shape == (2, 3, STRIDE, STRIDE) and batch["mask"].shape == (2, STRIDE, STRIDE)
    for i, path in enumerate(batch["path"]):
        assert torch.allclose(batch["image"][i, :, :H, :W], normalised(Path(path)), atol=1e-5)
    assert (batch["image"][:, :, H:, :] == 0).all() and (batch["image"][:, :, :, W:] == 0).all()
    expected = torch.from_numpy(label_grid([0, 1, 2, 255]).astype(np.int64))
    assert (batch["mask"][:, :H, :W] == expected).all()
    assert (batch["mask"][:, H:, :] == 255).all() and (batch["mask"][:, :, W:] == 255).all()


def test_flips_still_apply_to_whole_images(tmp_path):
    root = make_folder(tmp_path, {"train": 2, "val": 1})
    datamodule = whole_module(root, hflip=0.5, photometric=True)
    datamodule.setup("fit")
    dataset = datamodule.datasets["train"]
    dataset.transform.set_random_seed(0)
    upright = torch.from_numpy(label_grid([0, 1, 2, 255]).astype(np.int64))
    masks = [dataset[0]["mask"] for _ in range(20)]
    assert all(mask.shape == (H, W) for mask in masks)  # no scale, no crop
    flipped = sum(bool((mask == upright.flip(-1)).all()) for mask in masks)
    assert 0 < flipped < 20 and flipped + sum(bool((mask == upright).all()) for mask in masks) == 20


def test_mixed_sizes_are_refused_in_one_line_naming_the_setting(tmp_path):
    root = make_folder(tmp_path, {"train": 3, "val": 1})
    save(root / "images" / "train" / "odd.png", rgb(7, 20, 10))
    save(root / "masks" / "train" / "odd.png", label_grid([0, 1], 20, 10))
    with pytest.raises(ValueError) as refused:
        whole_module(root).whole_image_sizes()
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("data.crop_size=null with data.batch_size=2: a batch of whole images needs one")
    assert f"2 image sizes [H, W]: [{H}, {W}] (3, e.g. " in message and "[20, 10] (1, e.g. " in message
    assert "odd.png" in message and "set data.batch_size=1" in message
    sizes = whole_module(root, batch_size=1).whole_image_sizes()  # one image per batch: any sizes
    assert {size: len(paths) for size, paths in sizes.items()} == {(H, W): 3, (20, 10): 1}


def test_collate_refuses_a_batch_of_mixed_sizes():
    items = [
        {"image": torch.zeros(3, 4, 6), "mask": torch.zeros(4, 6, dtype=torch.long), "path": "a.png"},
        {"image": torch.zeros(3, 6, 4), "mask": torch.zeros(6, 4, dtype=torch.long), "path": "b.png"},
    ]
    with pytest.raises(
        ValueError, match=r"^data\.crop_size=null .*\[4, 6\] \(a\.png\) and \[6, 4\] \(b\.png\)"
    ):
        whole_image_collate(items, size_divisor=STRIDE)
    one = whole_image_collate(items[:1], ignore_index=7, size_divisor=5)
    assert one["image"].shape == (1, 3, 5, 10) and (one["mask"][0, 4:] == 7).all()


def test_base_size_is_refused_with_whole_images(tmp_path):
    with pytest.raises(ValueError, match=r"data\.base_size=\[96, 72\] with data\.crop_size=null"):
        whole_module(make_folder(tmp_path), base_size=[96, 72])


def test_downsampled_folder_trains_on_whole_shrunk_images(tmp_path):
    root = make_folder(tmp_path / "ds", {"train": 1, "val": 1})
    mask = np.zeros((64, 96), dtype=np.uint8)
    mask[40:60, 8:40] = 2
    for split in ("train", "val"):
        save(root / "images" / split / f"{split}00.png", rgb(1, 64, 96))
        save(root / "masks" / split / f"{split}00.png", mask)
    datamodule = whole_module(
        root, batch_size=1, hflip=0.0, photometric=False, cache_dir=str(tmp_path / "cache"), downsample=4
    )
    assert list(datamodule.whole_image_sizes()) == [(16, 24)]
    batch = next(iter(datamodule.train_dataloader()))
    assert batch["image"].shape == (1, 3, STRIDE, STRIDE)
    assert (batch["mask"][0, :16, :24] == torch.from_numpy(shrink_mask(mask, 4).astype(np.int64))).all()
    assert (batch["mask"][0, 16:] == 255).all() and (batch["mask"][0, :, 24:] == 255).all()


def test_a_crop_larger_than_the_shrunk_images_is_said_in_one_line_naming_both_keys(tmp_path):
    root = make_folder(tmp_path / "ds", {"train": 1, "val": 1})
    datamodule = SegDataModule(
        "folder", root=root, crop_size=[32, 32], batch_size=1, cache_dir=str(tmp_path / "cache"), downsample=4
    )
    datamodule.setup("fit")
    h, w = round(H / 4), round(W / 4)
    with pytest.warns(UserWarning) as said:
        check_crop_at_shrink((32, 32), 4, datamodule)
    message = str(said[0].message)
    assert "\n" not in message and message.startswith("data.crop_size=[32, 32] with data.downsample=4: ")
    assert f"is {h}x{w} (HxW) at that shrink" in message and f"at most [{h}, {w}]" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_crop_at_shrink((h, w), 4, datamodule)  # the shrunk size itself fits
        # At full resolution a larger crop pads, as documented: no warning either.
        check_crop_at_shrink((512, 512), 1, datamodule)


@pytest.mark.parametrize("crop_size", [None, [2, 2]])
def test_a_downsample_that_does_not_divide_a_training_image_is_refused_before_training(tmp_path, crop_size):
    """predict refuses an image data.downsample does not divide: training refuses one too, before it
    starts, naming the image, whether it trains on crops or on whole images."""
    root = make_folder(tmp_path / "ds", {"train": 2, "val": 1})
    cache = str(tmp_path / "cache")
    assert train_sizes(
        whole_module(root, cache_dir=cache, downsample=4, crop_size=crop_size)
    )  # 12x16: 4 divides
    datamodule = whole_module(root, cache_dir=cache, downsample=5, crop_size=crop_size)
    with pytest.raises(ValueError) as refused:
        train_sizes(datamodule)
    message = str(refused.value)
    assert "\n" not in message and message.startswith("data.downsample=5: training image ")
    assert f"train00.png is {W}x{H}, not a multiple of 5 on each side;" in message


@pytest.mark.skipif(not IDRID.is_dir(), reason=f"{IDRID} not present")
def test_one_idrid_image_at_one_eighth(tmp_path):
    """IDRiD_01 (4288x2848) as the only training image: 536x356 at downsample 8, padded to 544x384."""
    root = tmp_path / "idrid"
    for split in ("train", "val"):
        (root / "images" / split).mkdir(parents=True)
        (root / "masks" / split).mkdir(parents=True)
        (root / "images" / split / "IDRiD_01.jpg").symlink_to(IDRID / "images" / "train" / "IDRiD_01.jpg")
        (root / "masks" / split / "IDRiD_01.png").symlink_to(IDRID / "masks" / "train" / "IDRiD_01.png")
    (root / "classes.json").write_text((IDRID / "classes.json").read_text())
    datamodule = SegDataModule(
        "idrid", root=root, crop_size=None, batch_size=1, size_divisor=STRIDE, **LOADER,
        cache_dir=str(tmp_path / "cache"), downsample=8, hflip=0.0, vflip=0.0, rotate=0, photometric=False,
    )  # fmt: skip
    assert list(datamodule.whole_image_sizes()) == [(356, 536)]
    batch = next(iter(datamodule.train_dataloader()))
    assert batch["image"].shape == (1, 3, 384, 544) and batch["mask"].shape == (1, 384, 544)
    assert (batch["image"][0, :, 356:] == 0).all() and (batch["image"][0, :, :, 536:] == 0).all()
    assert (batch["mask"][0, 356:] == 255).all() and (batch["mask"][0, :, 536:] == 255).all()
    labels = set(batch["mask"][0, :356, :536].unique().tolist())
    classes = json.loads((IDRID / "classes.json").read_text())
    assert labels <= set(range(len(classes["classes"]))) and {0, 5} <= labels  # background, optic disc
