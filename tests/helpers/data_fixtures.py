"""Tiny datasets written on the fly in each official layout (for the data and evaluation tests)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

H, W = 12, 16  # fixture image size (height, width)
FOLDER_CLASSES = [("road", (128, 64, 128)), ("tree", (0, 128, 0)), ("car", (0, 0, 142))]


def save(path: Path, array: np.ndarray, mode: str | None = None) -> Path:
    """Write ``array`` as an image file (format from the suffix), creating parent folders."""
    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.fromarray(array) if mode is None else Image.fromarray(array, mode=mode)
    image.save(path)
    return path


def rgb(seed: int, h: int = H, w: int = W) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(h, w, 3), dtype=np.uint8)


def label_grid(values: list[int], h: int = H, w: int = W) -> np.ndarray:
    """A mask whose columns cycle through ``values`` (every value present, in known proportions)."""
    return np.array(values, dtype=np.uint8)[np.arange(w) % len(values)][None, :].repeat(h, axis=0)


def make_folder(root: Path, splits: dict[str, int] | None = None, lists: bool = False) -> Path:
    """folder/camvid layout: images/<split>/sNN.png + masks/<split>/sNN.png (values 0..2 and 255) and a
    camvid-style classes.json; with ``lists`` images/ and masks/ are flat and <split>.txt name the stems."""
    splits = splits or {"train": 3, "val": 2, "test": 2}
    classes = [{"id": i, "name": n, "color": list(c)} for i, (n, c) in enumerate(FOLDER_CLASSES)]
    root.mkdir(parents=True, exist_ok=True)
    (root / "classes.json").write_text(
        json.dumps({"classes": classes, "ignore": {"id": 255, "color": [0, 0, 0]}})
    )
    for s, (split, count) in enumerate(splits.items()):
        stems = [f"{split}{i:02d}" for i in range(count)]
        sub = "" if lists else split
        for i, stem in enumerate(stems):
            save(root / "images" / sub / f"{stem}.png", rgb(100 * s + i))
            save(root / "masks" / sub / f"{stem}.png", label_grid([0, 1, 2, 255]))
        if lists:
            (root / f"{split}.txt").write_text("\n".join(stems) + "\n")
    return root


def make_ade20k(root: Path) -> Path:
    """ADEChallengeData2016/images|annotations/training|validation with raw values 0..150."""
    base = root / "ADEChallengeData2016"
    for split, prefix in (("training", "ADE_train"), ("validation", "ADE_val")):
        for i in (1, 2):
            save(base / "images" / split / f"{prefix}_{i:08d}.jpg", rgb(i))
            save(base / "annotations" / split / f"{prefix}_{i:08d}.png", label_grid([0, 1, 2, 150]))
    return root


def make_cityscapes(root: Path, label_ids: list[int]) -> Path:
    """leftImg8bit + gtFine for two cities: aachen has *_labelIds.png only, bremen *_labelTrainIds.png too."""
    for split in ("train", "val"):
        for city in ("aachen", "bremen"):
            prefix = f"{city}_000000_000019"
            save(root / "leftImg8bit" / split / city / f"{prefix}_leftImg8bit.png", rgb(3))
            gt = root / "gtFine" / split / city
            save(gt / f"{prefix}_gtFine_labelIds.png", label_grid(label_ids))
            save(gt / f"{prefix}_gtFine_color.png", rgb(4))  # present in the release; never read
            if city == "bremen":
                save(gt / f"{prefix}_gtFine_labelTrainIds.png", label_grid([0, 13, 18, 255]))
    return root


def voc_palette_png(path: Path, indices: np.ndarray) -> Path:
    """A VOC-style palette PNG: pixel values are class indices, colours come from an arbitrary palette."""
    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.fromarray(indices, mode="P")
    image.putpalette(np.random.default_rng(0).integers(0, 256, 768, dtype=np.uint8).tolist())
    image.save(path)
    return path


def make_voc(root: Path, indices: np.ndarray) -> Path:
    """VOCdevkit/VOC2012 with JPEGImages, SegmentationClass (palette PNGs), SegmentationClassAug (8-bit
    grey PNGs) and ImageSets/Segmentation/{train,val,train_aug}.txt."""
    base = root / "VOCdevkit" / "VOC2012"
    ids = {"train": ["2007_000032"], "val": ["2007_000033"], "train_aug": ["2007_000032", "2008_000001"]}
    for i, name in enumerate(sorted({n for names in ids.values() for n in names})):
        save(base / "JPEGImages" / f"{name}.jpg", rgb(i))
        voc_palette_png(base / "SegmentationClass" / f"{name}.png", indices)
        save(base / "SegmentationClassAug" / f"{name}.png", np.full((H, W), 7, np.uint8))
    for split, names in ids.items():
        listing = base / "ImageSets" / "Segmentation" / f"{split}.txt"
        listing.parent.mkdir(parents=True, exist_ok=True)
        listing.write_text("\n".join(names) + "\n")
    return root
