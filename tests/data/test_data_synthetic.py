"""The synthetic dataset: deterministic per (seed, split, index), any size, and it needs global context."""

from __future__ import annotations

import dataclasses

import numpy as np

from segattn.data import SyntheticDataset, build_dataset
from segattn.data.synthetic import FRAME, MARGIN, Scene, Shape, render_scene


def _frame_word(image: np.ndarray) -> str:
    """The frame tone read off the image's corner pixel, independently of the generator's bookkeeping."""
    return "dark frame" if image[0, 0].mean() < 128 else "light frame"


def test_same_seed_same_data_other_seed_or_split_other_data():
    a, b = SyntheticDataset("train", seed=3), SyntheticDataset("train", seed=3)
    for i in (0, 7, 383):
        for x, y in zip(a.load(i), b.load(i), strict=True):
            np.testing.assert_array_equal(x, y)
    other_seed, other_split = SyntheticDataset("train", seed=4), SyntheticDataset("val", seed=3)
    for other in (other_seed, other_split):
        assert sum(not np.array_equal(a.load_image(i), other.load_image(i)) for i in range(8)) == 8
    assert not np.array_equal(a.load_image(0), a.load_image(1))


def test_any_resolution_and_item_format():
    dataset = build_dataset("synthetic", None, "test", image_size=(40, 100), num_test=3)
    item = dataset[2]
    assert len(dataset) == 3 and item["image"].shape == (3, 40, 100) and item["mask"].shape == (40, 100)
    assert item["path"] == "synthetic/test/000002"
    small, large = SyntheticDataset(image_size=48).load_mask(5), SyntheticDataset(image_size=96).load_mask(5)
    assert set(np.unique(small)) == set(np.unique(large))  # the same scene, rendered at two sizes


def test_classes_follow_the_frame_tone_everywhere():
    dataset = SyntheticDataset("train", num_samples=64)
    tones = set()
    for i in range(len(dataset)):
        image, mask = dataset.load(i)
        word = _frame_word(image)
        tones.add(word)
        names = {dataset.classes[k] for k in np.unique(mask) if k != 0}
        assert names and all(name.endswith(word) for name in names), (i, word, names)
    assert tones == {"dark frame", "light frame"}
    assert len(dataset.classes) == 5 and dataset.classes[0] == "background"


def test_shapes_stay_clear_of_the_frame():
    dataset = SyntheticDataset("train", image_size=64, num_samples=64)
    band = round((FRAME + MARGIN) * 64) - 1  # frame plus the free margin, in pixels (minus rounding)
    for i in range(len(dataset)):
        mask = dataset.load_mask(i)
        inner = np.zeros_like(mask, dtype=bool)
        inner[band:-band, band:-band] = True
        assert not mask[~inner].any()


def test_identical_local_patch_different_label_because_of_the_frame():
    square = Shape(kind=0, cy=0.5, cx=0.5, radius=0.1, color=(90, 160, 60))
    dark = Scene(frame=0, background=(120, 100, 140), shapes=(square,), noise_seed=11)
    light = dataclasses.replace(dark, frame=1)
    (img_d, mask_d), (img_l, mask_l) = render_scene(dark, 64), render_scene(light, 64)
    patch = np.s_[16:48, 16:48]  # the shape (26..38) and 10 pixels of background around it
    np.testing.assert_array_equal(img_d[patch], img_l[patch])
    assert mask_d[32, 32] != mask_l[32, 32]
    names = SyntheticDataset().classes
    assert names[mask_d[32, 32]] == f"square, {_frame_word(img_d)}" == "square, dark frame"
    assert names[mask_l[32, 32]] == f"square, {_frame_word(img_l)}" == "square, light frame"
