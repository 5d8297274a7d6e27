"""Raw mask values → train ids, in one place per dataset: a lookup table, or a palette for colour masks.

Every decoder refuses values it does not know, naming the file and the values, so that label encoding
mistakes (reduce_zero_label applied twice, 0/255 binary masks, colour PNGs) stop a run instead of
silently training on wrong targets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ..images import IGNORE_INDEX, Color, DataError, read_color_mask, read_mask


def describe_values(values: Sequence[int]) -> str:
    """Sorted integers with runs folded: [255, 0, 1, 2, 5] -> '0..2, 5, 255'."""
    runs: list[list[int]] = []
    for v in sorted(values):
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in runs) or "nothing"


class LabelMap:
    """A lookup table from raw mask values (uint8 or uint16) to train ids 0..K-1 or the ignore index.

    ``check_binary`` refuses masks holding only 0 and 255 while 255 means ignore: that is almost always
    a 0/255 binary mask whose foreground would silently be ignored.
    """

    def __init__(
        self,
        mapping: Mapping[int, int],
        dataset: str,
        ignore_index: int = IGNORE_INDEX,
        check_binary: bool = True,
    ):
        self.lut = np.full(max(256, max(mapping) + 1), -1, dtype=np.int16)
        for raw, train_id in mapping.items():
            self.lut[int(raw)] = int(train_id)
        self.dataset = dataset
        self.ignore_index = ignore_index
        self.check_binary = check_binary and self.lut[255] == ignore_index

    @classmethod
    def identity(cls, num_classes: int, dataset: str, ignore_index: int = IGNORE_INDEX) -> LabelMap:
        """Raw value = train id for 0..num_classes-1, plus the ignore index."""
        return cls({**{i: i for i in range(num_classes)}, ignore_index: ignore_index}, dataset, ignore_index)

    @property
    def expected(self) -> str:
        """Human-readable list of the raw values this table accepts."""
        return describe_values(np.flatnonzero(self.lut >= 0).tolist())

    def __call__(self, raw: np.ndarray, path: str | Path) -> np.ndarray:
        """Train ids (uint8 [H, W]) of a raw mask read from ``path``."""
        counts = np.bincount(raw.ravel(), minlength=len(self.lut))
        present = np.flatnonzero(counts)
        unknown = [int(v) for v in present if v >= len(self.lut) or self.lut[v] < 0]
        if unknown:
            shown = describe_values(unknown[:20]) + (", ..." if len(unknown) > 20 else "")
            raise DataError(
                f"mask {path} has unknown label values {{{shown}}}; dataset {self.dataset!r} expects "
                f"{self.expected} ({self.ignore_index} = ignore)",
                path,
            )
        if self.check_binary and present.tolist() == [0, 255]:
            raise DataError(
                f"mask {path} holds only the values 0 and 255: it looks like a binary 0/255 mask, but 255 "
                f"means ignore for dataset {self.dataset!r}, so its foreground would never be learned. "
                "Remap it (e.g. data=folder with data.mask_values={0:0,255:1})",
                path,
            )
        return self.lut[raw].astype(np.uint8)

    def read(self, path: str | Path) -> np.ndarray:
        """Read the index mask at ``path`` and map it to train ids."""
        return self(read_mask(path), path)


class ColorMap:
    """Colour-coded masks → train ids through a palette (class i has colour palette[i])."""

    def __init__(
        self,
        palette: Sequence[Color],
        dataset: str,
        ignore_color: Color | None = None,
        ignore_index: int = IGNORE_INDEX,
    ):
        self.codes = {_code(c): i for i, c in enumerate(palette)}
        if len(self.codes) != len(palette):
            raise ValueError(f"dataset {dataset!r}: the palette gives two classes the same colour: {palette}")
        if ignore_color is not None:
            self.codes[_code(ignore_color)] = ignore_index
        self.dataset = dataset

    def __call__(self, rgb: np.ndarray, path: str | Path) -> np.ndarray:
        """Train ids (uint8 [H, W]) of an RGB mask [H, W, 3] read from ``path``."""
        codes = _code(rgb.astype(np.uint32).transpose(2, 0, 1))
        colors, inverse = np.unique(codes, return_inverse=True)
        unknown = [c for c in colors.tolist() if c not in self.codes]
        if unknown:
            shown = ", ".join(str(_rgb(c)) for c in unknown[:10]) + (", ..." if len(unknown) > 10 else "")
            raise DataError(
                f"mask {path} has colours {shown} that are not in the palette of dataset {self.dataset!r} "
                "(classes.json colours or the ignore colour)",
                path,
            )
        ids = np.array([self.codes[c] for c in colors.tolist()], dtype=np.uint8)
        return ids[inverse.reshape(codes.shape)]

    def read(self, path: str | Path) -> np.ndarray:
        """Read the colour mask at ``path`` and map it to train ids."""
        return self(read_color_mask(path), path)


def _code(color):
    r, g, b = color
    return (r << 16) | (g << 8) | b


def _rgb(code: int) -> Color:
    return (code >> 16) & 255, (code >> 8) & 255, code & 255
