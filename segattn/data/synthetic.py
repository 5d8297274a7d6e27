"""``synthetic``: procedural shapes whose class depends on a global cue, generated on the fly from a seed.

Each image has a frame along its border, dark or light, and 1..max_shapes squares and discs of random
colours on a noisy background. A shape's class is (its kind, the frame's tone): a square under a dark
frame is a different class from the same square under a light frame. Shapes keep a margin from the frame,
so the pixels around a shape never reveal its class; the model has to look across the image. Scenes are
stored in relative coordinates, so an index renders the same scene at any resolution.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..files import conf_values
from ..images import as_hw
from .base import DataSource, SegDatasetBase, Transform
from .transforms import build_eval_transform

SYNTHETIC_CLASSES = [
    ("background", (0, 0, 0)),
    ("square, dark frame", (230, 25, 75)),
    ("disc, dark frame", (60, 180, 75)),
    ("square, light frame", (255, 225, 25)),
    ("disc, light frame", (0, 130, 200)),
]
SPLITS = ("train", "val", "test")
FRAME = 1 / 16  # frame width, fraction of the short side
MARGIN = 1 / 8  # free band between the frame and any shape, fraction of the short side
DEFAULTS = conf_values("data/synthetic")  # sizes, counts and seed, as conf/data/synthetic.yaml sets them
FRAME_TONES = ((20, 20, 20), (235, 235, 235))  # dark, light; shapes and background stay within 40..215


@dataclass(frozen=True)
class Shape:
    """A square (kind 0) or disc (kind 1); centre in fractions of (H, W), radius in fractions of min(H, W)."""

    kind: int
    cy: float
    cx: float
    radius: float
    color: tuple[int, int, int]


@dataclass(frozen=True)
class Scene:
    """Everything needed to render one image at any resolution."""

    frame: int  # 0 = dark, 1 = light
    background: tuple[int, int, int]
    shapes: tuple[Shape, ...]
    noise_seed: int


def shape_class(kind: int, frame: int) -> int:
    """Train id of a shape: 1 + kind + 2·frame (0 is background)."""
    return 1 + kind + 2 * frame


def sample_scene(rng: np.random.Generator, max_shapes: int = 4) -> Scene:
    """Draw a scene: frame tone, background colour, and 1..max_shapes shapes clear of the frame."""
    shapes = []
    for _ in range(int(rng.integers(1, max_shapes + 1))):
        radius = float(rng.uniform(0.07, 0.13))
        lo, hi = FRAME + MARGIN + radius, 1 - FRAME - MARGIN - radius
        color = tuple(int(c) for c in rng.integers(50, 206, size=3))
        cy, cx = (float(v) for v in rng.uniform(lo, hi, size=2))
        shapes.append(Shape(int(rng.integers(2)), cy, cx, radius, color))
    background = tuple(int(c) for c in rng.integers(70, 186, size=3))
    return Scene(int(rng.integers(2)), background, tuple(shapes), int(rng.integers(2**31)))


def render_scene(scene: Scene, size: int | Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(RGB uint8 [H, W, 3], train ids uint8 [H, W]) of a scene at ``size`` = [height, width]."""
    H, W = as_hw(size)
    short = min(H, W)
    noise = np.random.default_rng(scene.noise_seed).normal(0.0, 10.0, size=(H, W, 3))
    image = np.clip(np.asarray(scene.background, dtype=np.float64) + noise, 40, 215)
    mask = np.zeros((H, W), dtype=np.uint8)
    ys, xs = np.mgrid[0:H, 0:W] + 0.5  # pixel centres
    for shape in scene.shapes:
        dy, dx = ys - shape.cy * H, xs - shape.cx * W
        r = shape.radius * short
        inside = np.maximum(abs(dy), abs(dx)) <= r if shape.kind == 0 else dy**2 + dx**2 <= r**2
        image[inside] = shape.color
        mask[inside] = shape_class(shape.kind, scene.frame)
    f = max(2, round(FRAME * short))
    border = np.ones((H, W), dtype=bool)
    border[f:-f, f:-f] = False
    image[border] = FRAME_TONES[scene.frame]
    return image.round().astype(np.uint8), mask


class SyntheticDataset(SegDatasetBase):
    """``num_samples`` scenes of one split; index i of (seed, split) always renders the same scene."""

    def __init__(
        self,
        split: str = "train",
        image_size: int | Sequence[int] = DEFAULTS["image_size"],
        num_samples: int = DEFAULTS["num_train"],
        seed: int = DEFAULTS["seed"],
        max_shapes: int = DEFAULTS["max_shapes"],
        transform: Transform | None = None,
    ):
        if split not in SPLITS:
            raise ValueError(f"synthetic has splits {list(SPLITS)}, not {split!r}")
        self.split, self.size, self.num_samples = split, as_hw(image_size, "data.image_size"), num_samples
        self.seed, self.max_shapes = seed, max_shapes
        self.classes = [name for name, _ in SYNTHETIC_CLASSES]
        self.palette = [color for _, color in SYNTHETIC_CLASSES]
        self.transform = transform if transform is not None else build_eval_transform()

    def __len__(self) -> int:
        return self.num_samples

    def scene(self, index: int) -> Scene:
        """The scene of ``index``, drawn from a generator seeded by (seed, split, index)."""
        if not 0 <= index < self.num_samples:
            raise IndexError(f"index {index} out of range for {self.num_samples} synthetic samples")
        rng = np.random.default_rng([self.seed, SPLITS.index(self.split), index])
        return sample_scene(rng, self.max_shapes)

    def describe(self, index: int) -> str:
        return f"synthetic/{self.split}/{index:06d}"

    def load(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        return render_scene(self.scene(index), self.size)

    def image_size(self, index: int) -> tuple[int, int]:
        return self.size

    def load_image(self, index: int) -> np.ndarray:
        return self.load(index)[0]

    def load_mask(self, index: int) -> np.ndarray:
        return self.load(index)[1]


class SyntheticSource(DataSource):
    """The ``synthetic`` dataset family: sizes and seed in, one SyntheticDataset per split out."""

    name = "synthetic"

    def __init__(
        self,
        root: str | None = None,
        image_size: int | Sequence[int] = DEFAULTS["image_size"],
        num_train: int = DEFAULTS["num_train"],
        num_val: int = DEFAULTS["num_val"],
        num_test: int = DEFAULTS["num_test"],
        max_shapes: int = DEFAULTS["max_shapes"],
        seed: int = DEFAULTS["seed"],
    ):
        self.classes = [name for name, _ in SYNTHETIC_CLASSES]
        self.palette = [color for _, color in SYNTHETIC_CLASSES]
        self.image_size, self.max_shapes, self.seed = as_hw(image_size, "data.image_size"), max_shapes, seed
        self.sizes = {"train": num_train, "val": num_val, "test": num_test}

    def dataset(self, split: str, transform: Transform | None = None) -> SyntheticDataset:
        if split not in self.sizes:
            raise ValueError(f"synthetic has splits {list(self.sizes)}, not {split!r}")
        size, count = self.image_size, self.sizes[split]
        return SyntheticDataset(split, size, count, self.seed, self.max_shapes, transform)
