"""``cityscapes``: leftImg8bit + gtFine, 19 train classes; *_labelTrainIds.png, else *_labelIds.png mapped
through the official id → trainId table (cityscapesScripts ``labels.py``)."""

from __future__ import annotations

from pathlib import Path

from .base import FileLayout, Sample
from .labels import LabelMap

# (name, colour) of the 19 train ids, in train-id order
CITYSCAPES_CLASSES = [
    ("road", (128, 64, 128)), ("sidewalk", (244, 35, 232)), ("building", (70, 70, 70)),
    ("wall", (102, 102, 156)), ("fence", (190, 153, 153)), ("pole", (153, 153, 153)),
    ("traffic light", (250, 170, 30)), ("traffic sign", (220, 220, 0)), ("vegetation", (107, 142, 35)),
    ("terrain", (152, 251, 152)), ("sky", (70, 130, 180)), ("person", (220, 20, 60)), ("rider", (255, 0, 0)),
    ("car", (0, 0, 142)), ("truck", (0, 0, 70)), ("bus", (0, 60, 100)), ("train", (0, 80, 100)),
    ("motorcycle", (0, 0, 230)), ("bicycle", (119, 11, 32)),
]  # fmt: skip

# labelId → trainId for the labelIds that are evaluated; ids 0..33 not listed here are void (→ ignore):
# unlabeled, ego vehicle, rectification border, out of roi, static, dynamic, ground, parking, rail track,
# guard rail, bridge, tunnel, polegroup, caravan, trailer.
LABEL_ID_TO_TRAIN_ID = {
    7: 0, 8: 1, 11: 2, 12: 3, 13: 4, 17: 5, 19: 6, 20: 7, 21: 8, 22: 9, 23: 10, 24: 11, 25: 12, 26: 13,
    27: 14, 28: 15, 31: 16, 32: 17, 33: 18,
}  # fmt: skip


class CityscapesLayout(FileLayout):
    """leftImg8bit/<split>/<city>/*_leftImg8bit.png with gtFine/<split>/<city>/*_gtFine_labelTrainIds.png,
    or *_gtFine_labelIds.png where no trainIds file was generated."""

    name = "cityscapes"
    layout = "leftImg8bit/<split>/<city>/*_leftImg8bit.png + gtFine/<split>/<city>/*_gtFine_labelTrainIds.png"

    def __init__(self, root: str | Path):
        super().__init__(root)
        self.classes = [name for name, _ in CITYSCAPES_CLASSES]
        self.palette = [color for _, color in CITYSCAPES_CLASSES]
        self.train_ids = LabelMap.identity(len(self.classes), self.name, self.ignore_index)
        label_ids = {i: LABEL_ID_TO_TRAIN_ID.get(i, self.ignore_index) for i in range(34)}
        self.label_ids = LabelMap(label_ids, self.name, self.ignore_index)

    def samples(self, split: str) -> list[Sample]:
        images = self.require_dir(self.root / "leftImg8bit" / split)
        samples = []
        for image in sorted(images.glob("*/*_leftImg8bit.png")):
            prefix = image.name.removesuffix("_leftImg8bit.png")
            gt = self.root / "gtFine" / split / image.parent.name
            train_ids = gt / f"{prefix}_gtFine_labelTrainIds.png"
            if train_ids.is_file():
                samples.append(Sample(image, train_ids, self.train_ids))
            else:
                samples.append(Sample(image, gt / f"{prefix}_gtFine_labelIds.png", self.label_ids))
        return samples
