"""Training/eval pipelines: image and mask stay aligned, padding is ignore, cat_max_ratio holds."""

from __future__ import annotations

import albumentations as A
import numpy as np
import pytest
import torch
import yaml
from omegaconf import OmegaConf
from torch.utils.data import DataLoader, Dataset

from segattn.data import CatMaxRatioCrop, RandomResize, build_eval_transform, build_train_transform
from segattn.data.transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    WorkerSeeder,
    build_augment,
    max_class_ratio,
    stream_seed,
)
from segattn.errors import ConfigError
from segattn.record import check_plain_config
from segattn.training.run import recorded_data_config

LEVEL0, STEP = 30, 45  # pixel value of label k in the alignment test: 30 + 45 k


def _encoded_scene(seed: int, h: int = 48, w: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """An image whose pixel values spell out the mask: 8x8 blocks of random labels 0..4."""
    labels = np.random.default_rng(seed).integers(0, 5, size=(h // 8, w // 8)).astype(np.uint8)
    mask = labels.repeat(8, axis=0).repeat(8, axis=1)
    image = np.repeat((LEVEL0 + STEP * mask)[..., None], 3, axis=2).astype(np.uint8)
    return image, mask


def _interior(mask: np.ndarray) -> np.ndarray:
    """True where the 5x5 neighbourhood has a single label: bilinear resizing (up to 2x) blends image
    values only within 2 pixels of a label edge, so there the image must spell out the mask exactly.
    Pixels near the crop border are excluded: their neighbours outside the crop are unknown."""
    padded = np.pad(mask, 2, constant_values=254)
    windows = np.lib.stride_tricks.sliding_window_view(padded, (5, 5))
    return (windows.min(axis=(2, 3)) == windows.max(axis=(2, 3))) & (mask != 255)


def test_train_pipeline_keeps_image_and_mask_aligned_and_pads_with_ignore():
    transform = build_train_transform((40, 56), ratio_range=(0.5, 1.5), hflip=0.5, photometric=False)
    mean, std = np.array(IMAGENET_MEAN) * 255, np.array(IMAGENET_STD) * 255
    padded_seen = checked = 0
    for seed in range(30):
        transform.set_random_seed(seed)
        image, mask = _encoded_scene(seed)
        out = transform(image=image, mask=mask)
        img, msk = out["image"], out["mask"]
        assert img.shape == (40, 56, 3) and msk.shape == (40, 56)
        # padding: the source mask has no 255, so every 255 must be padding, where the image is exactly 0
        pad = msk == 255
        np.testing.assert_array_equal(pad, (img == 0).all(axis=2))
        padded_seen += pad.any()
        decoded = np.rint((img[..., 0] * std[0] + mean[0] - LEVEL0) / STEP)
        interior = _interior(msk)
        np.testing.assert_array_equal(decoded[interior], msk[interior])
        checked += interior.sum()
    assert padded_seen >= 5 and checked > 30 * 300  # both situations were really exercised


def test_random_resize_fits_base_size_like_mmseg():
    image, mask = np.zeros((100, 200, 3), np.uint8), np.zeros((100, 200), np.uint8)
    # fit 100x200 inside (long 2048, short 512) x ratio 1: factor min(2048/200, 512/100) = 5.12
    out = RandomResize((1.0, 1.0), base_size=(2048, 512))(image=image, mask=mask)
    assert out["image"].shape == (512, 1024, 3) and out["mask"].shape == (512, 1024)
    out = RandomResize((0.5, 0.5))(image=image, mask=mask)  # no base: ratio of the image's own size
    assert out["image"].shape == (50, 100, 3)


def test_resize_keeps_mask_values_exact():
    image, mask = _encoded_scene(0)
    out = RandomResize((1.37, 1.37))(image=image, mask=mask)
    assert set(np.unique(out["mask"])) <= set(np.unique(mask))  # nearest neighbour, no blended labels


def _mostly_one_class() -> np.ndarray:
    mask = np.zeros((64, 64), np.uint8)
    mask[25:39, 25:39] = 1  # 196 of 4096 pixels: the mask is 95.2% class 0
    return mask


def test_cat_max_ratio_crop_respects_ratio_when_a_valid_crop_exists():
    mask, image = _mostly_one_class(), np.zeros((64, 64, 3), np.uint8)
    assert (mask == 0).mean() > 0.95
    ratios = {}
    for limit in (0.9, 1.0):  # 1.0 disables the rule: plain random crops
        crop = CatMaxRatioCrop(32, 32, cat_max_ratio=limit)
        crop.set_random_seed(0)
        ratios[limit] = [max_class_ratio(crop(image=image, mask=mask)["mask"]) for _ in range(100)]
    assert sum(r >= 0.9 for r in ratios[1.0]) > 5  # plain crops often break the ratio ...
    assert all(r < 0.9 for r in ratios[0.9])  # ... the rule never does


def test_cat_max_ratio_crop_terminates_without_valid_crop():
    crop = CatMaxRatioCrop(8, 8, cat_max_ratio=0.75)
    out = crop(image=np.zeros((20, 20, 3), np.uint8), mask=np.zeros((20, 20), np.uint8))
    assert out["mask"].shape == (8, 8)


def test_eval_transform_full_resolution_or_short_side():
    image, mask = _encoded_scene(0, 48, 64)
    assert build_eval_transform()(image=image, mask=mask)["image"].shape == (48, 64, 3)
    out = build_eval_transform(short_side=24)(image=image, mask=mask)
    assert out["image"].shape == (24, 32, 3) and out["mask"].shape == (24, 32)
    assert set(np.unique(out["mask"])) <= set(np.unique(mask))


class _SameImage(Dataset):
    """Every index is the same image, so any difference between items comes from augmentation."""

    def __init__(self):
        self.transform = build_train_transform((24, 24), ratio_range=(0.5, 2.0), photometric=True)
        self.image, self.mask = _encoded_scene(0)

    def __len__(self):
        return 2

    def __getitem__(self, index):
        return torch.from_numpy(self.transform(image=self.image, mask=self.mask)["image"])


@pytest.mark.parametrize("seeder", [None, WorkerSeeder(rank=0)])
def test_workers_draw_different_augmentations_only_when_reseeded(seeder):
    loader = DataLoader(_SameImage(), batch_size=1, num_workers=2, worker_init_fn=seeder)
    first, second = list(loader)  # index 0 from worker 0, index 1 from worker 1: each worker's first draw
    assert torch.equal(first, second) == (seeder is None)  # forked workers share albumentations' state


def test_ranks_get_different_streams():
    assert stream_seed(1234, 0) != stream_seed(1234, 1)
    assert stream_seed(1234, 0) == stream_seed(1234, 0)


TODAYS_AUGMENT_YAML = """
- {_target_: albumentations.HorizontalFlip, p: 0.5}
- _target_: albumentations.VerticalFlip
  p: 0.5
- {_target_: albumentations.Rotate, limit: 15, border_mode: 0, fill: 0, fill_mask: 255, p: 0.5}
- {_target_: albumentations.ColorJitter, brightness: 0.125, contrast: 0.5, saturation: 0.5, hue: 0.1, p: 0.5}
"""


def test_augment_list_in_yaml_reproduces_the_default_pipeline_on_a_fixed_seed():
    settings = {"ratio_range": (0.5, 2.0), "hflip": 0.5, "vflip": 0.5, "rotate": 15, "photometric": True}
    default = build_train_transform((40, 56), **settings)
    listed = build_train_transform((40, 56), **settings, augment=yaml.safe_load(TODAYS_AUGMENT_YAML))
    for seed in range(8):
        image, mask = _encoded_scene(seed)
        default.set_random_seed(seed)
        listed.set_random_seed(seed)
        expected, got = default(image=image, mask=mask), listed(image=image, mask=mask)
        np.testing.assert_array_equal(got["image"], expected["image"])
        np.testing.assert_array_equal(got["mask"], expected["mask"])


def serialised(augment_yaml: str) -> dict:
    """The pipeline of ``_target_`` entries in albumentations' own serialised form (``A.to_dict``), as a
    YAML config file holds it."""
    return yaml.safe_load(yaml.safe_dump(A.to_dict(A.Compose(build_augment(yaml.safe_load(augment_yaml))))))


def test_augment_in_albumentations_serialised_form_equals_the_target_entries_on_a_fixed_seed():
    listed = build_train_transform((40, 56), augment=yaml.safe_load(TODAYS_AUGMENT_YAML))
    pipeline = serialised(TODAYS_AUGMENT_YAML)
    assert pipeline["transform"]["__class_fullname__"] == "Compose" and "__version__" in pipeline
    read = build_train_transform((40, 56), augment=pipeline)
    for seed in range(8):
        image, mask = _encoded_scene(seed)
        listed.set_random_seed(seed)
        read.set_random_seed(seed)
        expected, got = listed(image=image, mask=mask), read(image=image, mask=mask)
        np.testing.assert_array_equal(got["image"], expected["image"])
        np.testing.assert_array_equal(got["mask"], expected["mask"])


def test_augment_list_replaces_the_flips_and_colour():
    transform = build_train_transform(
        (48, 64), ratio_range=(1.0, 1.0), augment=[{"_target_": "albumentations.VerticalFlip", "p": 1.0}]
    )
    image, mask = _encoded_scene(0)
    out = transform(image=image, mask=mask)
    np.testing.assert_array_equal(out["mask"], mask[::-1])  # flipped every time; hflip=0.5 not applied
    names = [type(step).__name__ for step in transform.transforms]
    assert "HorizontalFlip" not in names and "ColorJitter" not in names


@pytest.mark.parametrize(
    ("augment", "message"),
    [
        ([{"_target_": "albumentations.HorizontalFlip"}, {"_target_": "Flipp"}],
         "data.augment[1]: albumentations has no transform 'Flipp'"),
        ([{"_target_": "albumentations.HorizontalFlip", "pp": 0.5}],
         "data.augment[0] HorizontalFlip: unexpected argument 'pp'; it takes p"),
        ([{"_target_": "albumentations.HorizontalFlip", "p": 2}],
         "data.augment[0] HorizontalFlip: refused its arguments:"),
        ([{"p": 0.5}], "data.augment[0]={'p': 0.5}: expected a mapping with the _target_"),
        ("HorizontalFlip", "data.augment='HorizontalFlip': expected a list of"),
    ],
)  # fmt: skip
def test_augment_refuses_an_unknown_transform_or_argument_in_one_line(augment, message):
    with pytest.raises(ConfigError) as caught:
        build_train_transform((40, 56), augment=augment)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


BLURR = {"__class_fullname__": "Blurr", "p": 0.5}  # in a OneOf


def misspelt(path: tuple, value: object) -> dict:
    """Today's pipeline in albumentations' serialised form, the value at ``path`` (keys and indices below
    ``transform``) replaced."""
    pipeline = serialised(TODAYS_AUGMENT_YAML)
    node = pipeline["transform"]
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    return pipeline


@pytest.mark.parametrize(
    ("augment", "message"),
    [
        (misspelt(("transforms", 1, "__class_fullname__"), "VerticalFlipp"),
         "data.augment.transform.transforms[1]: albumentations has no transform 'VerticalFlipp'; did you "
         "mean VerticalFlip"),
        (misspelt(("transforms", 0, "pp"), 0.5),
         "data.augment.transform.transforms[0] HorizontalFlip: unexpected argument 'pp'; it takes p"),
        (misspelt(("transforms", 0, "p"), 2), "data.augment: albumentations refused it: 1 validation error"),
        (misspelt(("transforms", 2), "Rotate"), "data.augment.transform.transforms[2]='Rotate': expected a"),
        (misspelt(("__class_fullname__",), "Composee"), "data.augment.transform: albumentations has no"),
        (misspelt(("transforms", 3), {"__class_fullname__": "OneOf", "transforms": [BLURR]}),
         "data.augment.transform.transforms[3].transforms[0]: albumentations has no transform 'Blurr'"),
    ],
)  # fmt: skip
def test_augment_in_serialised_form_refuses_an_unknown_transform_or_argument_in_one_line(augment, message):
    with pytest.raises(ConfigError) as caught:
        build_train_transform((40, 56), augment=augment)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_the_recorded_data_config_leaves_the_augment_list_out():
    """A checkpoint's record refuses ``_target_`` keys, and evaluation does not augment."""
    augment = [{"_target_": "albumentations.VerticalFlip", "p": 1.0}]
    data = recorded_data_config(OmegaConf.create({"data": {"name": "synthetic", "augment": augment}}))
    assert data == {"name": "synthetic"}
    check_plain_config(data, "checkpoint")
