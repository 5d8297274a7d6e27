"""``voc``: Pascal VOC 2012 segmentation, 21 classes; palette PNG index = class id, 255 border = ignore."""

from __future__ import annotations

from pathlib import Path

from ..images import DataError, default_palette
from .base import FileLayout, Sample
from .labels import LabelMap

VOC_CLASSES = [
    "background", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
    "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train",
    "tvmonitor",
]  # fmt: skip


class VOCLayout(FileLayout):
    """VOCdevkit/VOC2012 with JPEGImages/, SegmentationClass/ and ImageSets/Segmentation/<split>.txt
    (data.root may be VOC2012, VOCdevkit or their parent). With ``aug=True`` the train split reads
    ImageSets/Segmentation/train_aug.txt and SegmentationClassAug/ (the SBD-augmented 10,582 images)."""

    name = "voc"
    layout = (
        "VOCdevkit/VOC2012/{JPEGImages/*.jpg, SegmentationClass/*.png, ImageSets/Segmentation/<split>.txt}"
    )

    def __init__(self, root: str | Path, aug: bool = False):
        super().__init__(root)
        self.classes = list(VOC_CLASSES)
        self.palette = default_palette(len(VOC_CLASSES))
        candidates = [self.root / "VOCdevkit" / "VOC2012", self.root / "VOC2012", self.root]
        self.base = next((c for c in candidates if (c / "JPEGImages").is_dir()), candidates[0])
        self.aug = aug
        self.labels = LabelMap.identity(len(self.classes), self.name, self.ignore_index)

    def samples(self, split: str) -> list[Sample]:
        self.require_dir(self.base / "JPEGImages")
        aug = self.aug and split == "train"
        listing = self.base / "ImageSets" / "Segmentation" / ("train_aug.txt" if aug else f"{split}.txt")
        if not listing.is_file():
            message = f"dataset 'voc': split list {listing} does not exist; expected {self.layout}"
            raise DataError(message, listing)
        # a line is an id ("2007_000032") or, in DeepLab-style lists, "/JPEGImages/<id>.jpg /<masks>/<id>.png"
        ids = [Path(line.split()[0]).stem for line in listing.read_text().splitlines() if line.strip()]
        masks = self.base / ("SegmentationClassAug" if aug else "SegmentationClass")
        return [Sample(self.base / "JPEGImages" / f"{i}.jpg", masks / f"{i}.png", self.labels) for i in ids]
