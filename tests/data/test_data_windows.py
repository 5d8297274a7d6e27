"""Large images: the decode-once cache, shrinking by area and by majority label, foreground-centred
window crops, and evaluation items at reduced resolution with full-resolution masks."""

from __future__ import annotations

import os

import numpy as np
import pytest
from data_fixtures import make_folder, save

from segattn.data import SegDataModule
from segattn.data.decoded import DecodedCache, foreground_positions, shrink_mask
from segattn.data.folder import FolderLayout
from segattn.data.transforms import build_eval_transform, build_train_transform
from segattn.images import shrink_image


def test_shrink_mask_keeps_the_label_covering_most_of_each_pixel():
    mask = np.zeros((4, 8), dtype=np.uint8)
    mask[:2, :2] = 1  # fills output pixel (0, 0)
    mask[2:, 2:4] = 2
    mask[3, 3] = 3  # a quarter of output pixel (1, 1): loses to label 2
    mask[:2, 4] = mask[:1, 5] = 3  # three quarters of output pixel (0, 2)
    assert shrink_mask(mask, 2).tolist() == [[1, 0, 3, 0], [0, 2, 0, 0]]
    assert shrink_mask(mask, 1) is mask


def test_shrink_image_averages_areas_and_rounds_sizes():
    image = np.zeros((6, 10, 3), dtype=np.uint8)
    image[:2, :2] = 200
    small = shrink_image(image, 2)
    assert small.shape == (3, 5, 3) and small[0, 0].tolist() == [200, 200, 200]
    assert shrink_image(np.zeros((7, 9, 3), dtype=np.uint8), 4).shape == (2, 2, 3)  # round(7/4), round(9/4)


def test_foreground_positions_lists_every_pixel_of_a_small_class():
    mask = np.zeros((5, 7), dtype=np.uint8)
    mask[1, 2] = mask[4, 6] = 5
    positions = foreground_positions(mask)
    assert positions[5].tolist() == [1 * 7 + 2, 4 * 7 + 6]
    assert positions[0].size == 33


@pytest.fixture
def large_folder(tmp_path):
    """One 64x96 image whose only lesion (class 2) is a 3x3 patch near the bottom right corner."""
    root = make_folder(tmp_path / "ds", {"train": 1, "val": 1})
    mask = np.zeros((64, 96), dtype=np.uint8)
    mask[56:59, 88:91] = 2
    for split in ("train", "val"):
        image = np.random.default_rng(0).integers(0, 256, (64, 96, 3), dtype=np.uint8)
        save(root / "images" / split / f"{split}00.png", image)
        save(root / "masks" / split / f"{split}00.png", mask)
    return root


def test_cache_decodes_once_and_again_when_the_source_changes(large_folder, tmp_path, capsys):
    layout = FolderLayout(large_folder, cache_dir=tmp_path / "cache")
    sample = layout.samples("train")[0]
    image = layout.cache.image(sample)
    assert isinstance(image, np.memmap) and image.shape == (64, 96, 3)
    told = capsys.readouterr().err  # the first write says where the cache grows, once per process
    assert f"decoding images once into {tmp_path / 'cache'} (data.cache_dir; image.npy of" in told
    files = sorted((tmp_path / "cache").rglob("*.npy"))
    assert len(files) == 1
    before = files[0].stat().st_mtime_ns
    layout.cache.image(sample)  # read back, not written again
    assert files[0].stat().st_mtime_ns == before
    os.utime(sample.image, ns=(before + 10**9, before + 10**9))  # the source changed
    layout.cache.image(sample)
    assert len(sorted((tmp_path / "cache").rglob("image.npy"))) == 2
    assert capsys.readouterr().err == ""  # a second write says nothing more
    assert layout.cache.mask(sample, 2).shape == (32, 48)
    assert not list((tmp_path / "cache").rglob("*.tmp"))
    uncached = DecodedCache(None)
    assert np.array_equal(uncached.image(sample), image) and not isinstance(uncached.image(sample), np.memmap)


def window_items(root, cache, foreground_prob, count=40, crop=16, ratio=(1.0, 1.0)):
    layout = FolderLayout(root, cache_dir=cache, foreground_prob=foreground_prob)
    transform = build_train_transform((crop, crop), hflip=0, photometric=False, cropped=True)
    dataset = layout.window_dataset("train", transform, (crop, crop), list(ratio))
    transform.set_random_seed(3)
    return [dataset[0] for _ in range(count)]


def test_foreground_crops_always_hold_the_rare_class_uniform_ones_rarely(large_folder, tmp_path):
    centred = window_items(large_folder, tmp_path / "cache", foreground_prob=1.0)
    assert all((item["mask"] == 2).any() for item in centred)
    uniform = window_items(large_folder, tmp_path / "cache", foreground_prob=0.0)
    assert sum((item["mask"] == 2).any().item() for item in uniform) < 10  # 3x3 of 64x96: about 5 %
    assert all(item["image"].shape == (3, 16, 16) and item["mask"].shape == (16, 16) for item in uniform)


def test_window_crops_are_reproducible_and_scaled(large_folder, tmp_path):
    first = window_items(large_folder, tmp_path / "cache", 0.5, count=5)
    again = window_items(large_folder, tmp_path / "cache", 0.5, count=5)
    assert all((a["image"] == b["image"]).all() for a, b in zip(first, again, strict=True))
    zoomed = window_items(large_folder, tmp_path / "cache", 0.0, count=3, ratio=(2.0, 2.0))
    assert all(item["image"].shape == (3, 16, 16) for item in zoomed)  # an 8x8 window resized 2x


def test_reduced_evaluation_items_keep_full_resolution_masks(large_folder, tmp_path):
    layout = FolderLayout(large_folder, cache_dir=tmp_path / "cache", downsample=4)
    item = layout.dataset("val", build_eval_transform())[0]
    assert item["image"].shape == (3, 16, 24) and item["mask"].shape == (64, 96)
    assert int((item["mask"] == 2).sum()) == 9


def test_datamodule_reads_windows_when_a_cache_is_set(large_folder, tmp_path):
    datamodule = SegDataModule(
        "folder", large_folder, crop_size=[16, 16], ratio_range=[1.0, 1.0], vflip=0.5, rotate=10,
        cache_dir=str(tmp_path / "cache"), foreground_prob=0.5, batch_size=2,
    )  # fmt: skip
    datamodule.setup("fit")
    batch = next(iter(datamodule.train_dataloader()))
    assert batch["image"].shape == (1, 3, 16, 16)  # one train image, the last partial batch kept


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [("downsample", 0, "data.downsample=0"), ("foreground_prob", 1.5, "data.foreground_prob=1.5")],
)
def test_bad_large_image_options_name_the_key(large_folder, option, value, message):
    with pytest.raises(ValueError, match=message):
        FolderLayout(large_folder, **{option: value})
