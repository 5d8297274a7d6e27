"""Which rows of the image this process holds, and the group it shares the image with.

A band group of P processes splits the stride-padded image into P bands of whole stride multiples, group rank
0 at the top. The layers consult the active split (``splitting``) while a band's forward and backward run.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch.distributed as dist


@dataclass(frozen=True)
class Band:
    """Rows [start, stop) of an image ``height`` rows high (pixels of the padded image, or tokens of a
    grid when taken ``at_stride``)."""

    start: int
    stop: int
    height: int

    @property
    def rows(self) -> int:
        return self.stop - self.start

    def at_stride(self, stride: int) -> Band:
        """The same band on a grid ``stride`` times coarser; every bound must be a multiple of it."""
        if self.start % stride or self.stop % stride or self.height % stride:
            raise ValueError(
                f"band rows {self.start}:{self.stop} of {self.height} are not multiples of {stride}"
            )
        return Band(self.start // stride, self.stop // stride, self.height // stride)

    def global_count(self, local_count: int) -> int:
        """Elements over the whole image of a per-row quantity that is ``local_count`` over this band."""
        total, remainder = divmod(local_count * self.height, self.rows)
        if remainder:
            raise ValueError(
                f"{local_count} elements do not split evenly over the {self.rows} rows of the band"
            )
        return total


@dataclass(frozen=True)
class BandGroup:
    """The processes that share one image: ``peers[i]`` is the global rank holding band i (top first);
    ``index`` is this process's band; ``group`` is their torch.distributed process group."""

    group: dist.ProcessGroup
    peers: tuple[int, ...]
    index: int

    @property
    def size(self) -> int:
        return len(self.peers)

    @property
    def above(self) -> int | None:
        """Global rank of the band above this one; None at the image's top edge."""
        return self.peers[self.index - 1] if self.index > 0 else None

    @property
    def below(self) -> int | None:
        """Global rank of the band below this one; None at the image's bottom edge."""
        return self.peers[self.index + 1] if self.index + 1 < self.size else None


@dataclass(frozen=True)
class Split:
    """The active split: this process's band of the padded image and the group holding the others."""

    group: BandGroup
    band: Band


_ACTIVE: list[Split] = []


def active_split() -> Split | None:
    """The split the running forward (or backward) computes on; None outside ``splitting``."""
    return _ACTIVE[-1] if _ACTIVE else None


def tokens_split() -> bool:
    """Whether the image's tokens are split across processes; autograd Functions, which sum over all tokens
    inside one autograd node, then give way to the plain formulas."""
    return bool(_ACTIVE)


@contextmanager
def splitting(group: BandGroup, band: Band) -> Iterator[Split]:
    """Make (group, band) the active split for the duration of the block."""
    split = Split(group, band)
    _ACTIVE.append(split)
    try:
        yield split
    finally:
        _ACTIVE.pop()


def split_rows(height: int, stride: int, bands: int, min_rows: int) -> list[Band]:
    """``height`` rows (a multiple of ``stride``) split into ``bands`` contiguous bands of whole stride units,
    as equal as possible (the top bands take the extra units), each at least ``min_rows`` units: the halo of
    the network's deepest convolution."""
    if height % stride:
        raise ValueError(f"image height {height} is not a multiple of the model stride {stride}")
    units = height // stride
    if units < bands * min_rows:
        raise ValueError(
            f"an image {height} rows high (padded to the model stride {stride}) is too small to split into "
            f"{bands} bands: each band needs at least {min_rows * stride} rows ({min_rows} rows at stride "
            f"{stride}); use at least {bands * min_rows * stride} rows or fewer bands"
        )
    base, extra = divmod(units, bands)
    out, start = [], 0
    for i in range(bands):
        stop = start + (base + (i < extra)) * stride
        out.append(Band(start, stop, height))
        start = stop
    return out
