"""Each dataset family reads its official on-disk layout and maps labels to train ids correctly."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from data_fixtures import (
    FOLDER_CLASSES,
    H,
    W,
    label_grid,
    make_ade20k,
    make_cityscapes,
    make_folder,
    make_voc,
    rgb,
    save,
)

from segattn.data import DataError, build_dataset, build_source


def _masks(dataset) -> list[np.ndarray]:
    return [dataset.load_mask(i) for i in range(len(dataset))]


def test_ade20k_reduce_zero_label_once(tmp_path):
    make_ade20k(tmp_path)
    for root in (tmp_path, tmp_path / "ADEChallengeData2016"):  # data.root may be the folder or its parent
        train = build_dataset("ade20k", root, "train")
        assert [p.image.name for p in train.samples] == ["ADE_train_00000001.jpg", "ADE_train_00000002.jpg"]
        # raw 0 ("other") -> ignore, raw k -> k - 1
        np.testing.assert_array_equal(train.load_mask(0), label_grid([255, 0, 1, 149]))
    val = build_dataset("ade20k", tmp_path, "val")
    assert (
        len(val) == 2 and len(val.classes) == 150 and val.classes[0] == "wall" and val.classes[149] == "flag"
    )


def test_ade20k_refuses_values_above_150(tmp_path):
    make_ade20k(tmp_path)
    bad = tmp_path / "ADEChallengeData2016" / "annotations" / "training" / "ADE_train_00000002.png"
    save(bad, label_grid([0, 151]))
    dataset = build_dataset("ade20k", tmp_path, "train")
    with pytest.raises(DataError, match=r"ADE_train_00000002\.png has unknown label values \{151\}"):
        dataset.load_mask(1)


def test_cityscapes_label_ids_follow_official_table(tmp_path):
    # official cityscapesScripts table: road 7->0, sidewalk 8->1, person 24->11, car 26->13, bicycle 33->18;
    # unlabeled 0, parking 9, guard rail 14 and caravan 29 are void -> 255
    make_cityscapes(tmp_path, [7, 8, 24, 26, 33, 0, 9, 14, 29])
    dataset = build_dataset("cityscapes", tmp_path, "train")
    assert [s.image.parent.name for s in dataset.samples] == ["aachen", "bremen"]
    assert dataset.samples[0].mask.name.endswith("_gtFine_labelIds.png")
    assert dataset.samples[1].mask.name.endswith("_gtFine_labelTrainIds.png")  # preferred when present
    aachen, bremen = _masks(dataset)
    np.testing.assert_array_equal(aachen, label_grid([0, 1, 11, 13, 18, 255, 255, 255, 255]))
    np.testing.assert_array_equal(bremen, label_grid([0, 13, 18, 255]))
    assert (
        len(dataset.classes) == 19 and dataset.classes[13] == "car" and dataset.palette[0] == (128, 64, 128)
    )


def test_voc_palette_indices_and_border(tmp_path):
    indices = np.zeros((H, W), np.uint8)
    indices[3:9, 4:12] = 15  # person
    indices[2, 3:13] = indices[9, 3:13] = 255  # the white border around objects
    make_voc(tmp_path, indices)
    train = build_dataset("voc", tmp_path, "train")
    assert [s.image.name for s in train.samples] == ["2007_000032.jpg"]
    np.testing.assert_array_equal(train.load_mask(0), indices)  # palette colours play no part
    assert train.classes[15] == "person" and train.palette[15] == (192, 128, 128)
    for root in (tmp_path / "VOCdevkit", tmp_path / "VOCdevkit" / "VOC2012"):
        assert len(build_dataset("voc", root, "val")) == 1
    aug = build_dataset("voc", tmp_path, "train", aug=True)
    assert [s.mask.parent.name for s in aug.samples] == ["SegmentationClassAug"] * 2
    assert (aug.load_mask(1) == 7).all()


def test_folder_split_subfolders_and_lists_give_same_samples(tmp_path):
    by_folder = build_dataset("folder", make_folder(tmp_path / "a"), "train")
    by_list = build_dataset("folder", make_folder(tmp_path / "b", lists=True), "train")
    assert [s.image.name for s in by_folder.samples] == [s.image.name for s in by_list.samples]
    assert [s.image.name for s in by_folder.samples] == ["train00.png", "train01.png", "train02.png"]
    assert by_folder.classes == [n for n, _ in FOLDER_CLASSES]
    assert by_folder.palette == [c for _, c in FOLDER_CLASSES]
    np.testing.assert_array_equal(by_list.load_mask(0), label_grid([0, 1, 2, 255]))


def test_folder_colour_masks_map_through_palette(tmp_path):
    root = make_folder(tmp_path)
    ids = label_grid([2, 0, 255, 1])
    colours = {0: (128, 64, 128), 1: (0, 128, 0), 2: (0, 0, 142), 255: (0, 0, 0)}  # classes.json colours
    save(
        root / "masks" / "train" / "train00.png",
        np.array([[colours[v] for v in row] for row in ids], np.uint8),
    )
    dataset = build_dataset("folder", root, "train", mask_format="color")
    np.testing.assert_array_equal(dataset.load_mask(0), ids)
    save(root / "masks" / "train" / "train01.png", np.full((H, W, 3), (1, 2, 3), np.uint8))
    with pytest.raises(DataError, match=r"train01\.png has colours \(1, 2, 3\)"):
        dataset.load_mask(1)


def test_folder_mask_values_and_suffix(tmp_path):
    root = tmp_path / "binary"
    (root).mkdir()
    (root / "classes.json").write_text(json.dumps(["background", "crack"]))
    save(root / "images" / "train" / "a.jpg", rgb(0))
    save(root / "masks" / "train" / "a_mask.png", label_grid([0, 255]))
    dataset = build_dataset("folder", root, "train", mask_values={0: 0, 255: 1}, mask_suffix="_mask")
    np.testing.assert_array_equal(dataset.load_mask(0), label_grid([0, 1]))
    with pytest.raises(ValueError, match=r"train ids must be 0\.\.1"):
        build_source("folder", root, mask_values={0: 0, 255: 2})


def test_camvid_layout_uses_builtin_classes_without_classes_json(tmp_path):
    root = make_folder(tmp_path)
    (root / "classes.json").unlink()
    source = build_source("camvid", root)
    assert (
        len(source.classes) == 11 and source.classes[10] == "bicyclist" and source.palette[4] == (60, 40, 222)
    )
    with pytest.raises(DataError, match=r"no classes\.json"):
        build_source("folder", root)


def test_item_is_normalised_tensor_dict(tmp_path):
    dataset = build_dataset("folder", make_folder(tmp_path), "val")
    item = dataset[1]
    assert set(item) == {"image", "mask", "path"} and item["path"].endswith("val01.png")
    assert item["image"].dtype == torch.float32 and item["image"].shape == (3, H, W)
    assert item["mask"].dtype == torch.long and item["mask"].shape == (H, W)
    raw = torch.from_numpy(rgb(100 + 1)).permute(2, 0, 1).float() / 255  # split 1 ("val"), image 1
    mean, std = (
        torch.tensor([0.485, 0.456, 0.406])[:, None, None],
        torch.tensor([0.229, 0.224, 0.225])[:, None, None],
    )
    torch.testing.assert_close(item["image"], (raw - mean) / std, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("name", "make", "expected"),
    [
        ("camvid", lambda root: root, "does not exist"),
        ("ade20k", lambda root: root, "does not exist"),
        ("voc", lambda root: root, "does not exist"),
        ("folder", lambda root: make_folder(root, {"train": 1}), "no split 'val'"),
    ],
)
def test_missing_folders_and_splits_name_the_expected_layout(tmp_path, name, make, expected):
    root = make(tmp_path / "data")
    with pytest.raises(DataError, match=expected):
        build_source(name, root, **({"classes": ["a"]} if name == "folder" else {})).dataset("val")


def test_empty_split_is_an_error(tmp_path):
    root = make_folder(tmp_path, {"train": 1, "val": 0})
    (root / "images" / "val").mkdir(parents=True)
    with pytest.raises(DataError, match=r"split 'val' of dataset 'folder' .* is empty"):
        build_dataset("folder", root, "val")


def test_unknown_names_and_options_list_the_valid_ones():
    with pytest.raises(
        ValueError, match="expected one of: ade20k, camvid, cityscapes, folder, idrid, raster, synthetic, voc"
    ):
        build_source("kitti", "x")
    with pytest.raises(ValueError, match=r"no option\(s\) \['aug'\]; its options are: classes, mask_format"):
        build_source("folder", "x", aug=True)
    with pytest.raises(ValueError, match=r"needs data\.root"):
        build_source("camvid", None)
