"""``ade20k``: the SceneParsing (ADEChallengeData2016) release, 150 classes, reduce_zero_label done once."""

from __future__ import annotations

from pathlib import Path

from ..images import default_palette
from .base import FileLayout, Sample
from .labels import LabelMap

ADE20K_CLASSES = [
    "wall", "building", "sky", "floor", "tree", "ceiling", "road", "bed", "windowpane", "grass", "cabinet",
    "sidewalk", "person", "earth", "door", "table", "mountain", "plant", "curtain", "chair", "car", "water",
    "painting", "sofa", "shelf", "house", "sea", "mirror", "rug", "field", "armchair", "seat", "fence",
    "desk", "rock", "wardrobe", "lamp", "bathtub", "railing", "cushion", "base", "box", "column", "signboard",
    "chest of drawers", "counter", "sand", "sink", "skyscraper", "fireplace", "refrigerator", "grandstand",
    "path", "stairs", "runway", "case", "pool table", "pillow", "screen door", "stairway", "river", "bridge",
    "bookcase", "blind", "coffee table", "toilet", "flower", "book", "hill", "bench", "countertop", "stove",
    "palm", "kitchen island", "computer", "swivel chair", "boat", "bar", "arcade machine", "hovel", "bus",
    "towel", "light", "truck", "tower", "chandelier", "awning", "streetlight", "booth", "television receiver",
    "airplane", "dirt track", "apparel", "pole", "land", "bannister", "escalator", "ottoman", "bottle",
    "buffet", "poster", "stage", "van", "ship", "fountain", "conveyer belt", "canopy", "washer", "plaything",
    "swimming pool", "stool", "barrel", "basket", "waterfall", "tent", "bag", "minibike", "cradle", "oven",
    "ball", "food", "step", "tank", "trade name", "microwave", "pot", "animal", "bicycle", "lake",
    "dishwasher", "screen", "blanket", "sculpture", "hood", "sconce", "vase", "traffic light", "tray",
    "ashcan", "fan", "pier", "crt screen", "plate", "monitor", "bulletin board", "shower", "radiator",
    "glass", "clock", "flag",
]  # fmt: skip


class ADE20KLayout(FileLayout):
    """images/{training,validation}/*.jpg + annotations/{training,validation}/*.png under
    ADEChallengeData2016 (data.root may be that folder or its parent). Raw 0 = "other" → ignore,
    raw k → train id k-1 (reduce_zero_label), in this table only."""

    name = "ade20k"
    layout = "ADEChallengeData2016/images/<training|validation>/*.jpg + annotations/<...>/*.png"

    def __init__(self, root: str | Path):
        super().__init__(root)
        self.classes = list(ADE20K_CLASSES)
        self.palette = default_palette(len(ADE20K_CLASSES))
        self.splits = {"train": "training", "val": "validation"}
        nested = self.root / "ADEChallengeData2016"
        self.base = nested if nested.is_dir() else self.root
        reduce_zero_label = {0: self.ignore_index, **{k: k - 1 for k in range(1, len(self.classes) + 1)}}
        self.labels = LabelMap(reduce_zero_label, self.name, self.ignore_index)

    def samples(self, split: str) -> list[Sample]:
        if split not in self.splits:
            raise ValueError(f"ade20k has splits {sorted(self.splits)} (no test labels), not {split!r}")
        folder = self.splits[split]
        images = self.require_dir(self.base / "images" / folder)
        masks = self.base / "annotations" / folder
        return [Sample(p, masks / f"{p.stem}.png", self.labels) for p in sorted(images.glob("*.jpg"))]
