"""A Segmentor's forward on this process's band of an image, and the check that a model can be split."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Protocol

import torch.nn.functional as F
from torch import Tensor, nn

from .bands import Band, BandGroup, Split, active_split, split_rows, splitting
from .draws import drawing_from, image_seed
from .ops import BandOps


class BandSegmentor(Protocol):
    """What ``band_forward`` needs of ``segattn.models.Segmentor``."""

    stride: int

    def padded_logits(self, padded: Tensor, with_aux: bool) -> tuple[Tensor, Tensor | None]: ...


def min_band_rows(model: nn.Module) -> int:
    """Rows at the deepest stride every band needs: the largest halo of any convolution or pooling window of
    ``model`` (a bound: each window is assumed to run at the deepest stride)."""
    halos = [1]  # bilinear upsampling takes one row
    for module in model.modules():
        padding = getattr(module, "padding", None)
        if isinstance(module, nn.Conv2d | nn.MaxPool2d) and not isinstance(padding, str):
            halos.append(padding if isinstance(padding, int) else padding[0])
    return max(halos)


def image_bands(model: BandSegmentor, height: int, bands: int) -> list[Band]:
    """The bands the padded height of an image ``height`` rows high splits into (see ``split_rows``)."""
    padded = (height + model.stride - 1) // model.stride * model.stride
    return split_rows(padded, model.stride, bands, min_band_rows(model))  # type: ignore[arg-type]


@contextmanager
def on_band(group: BandGroup, band: Band) -> Iterator[Split]:
    """Run the block as ``band`` of an image shared by ``group``: the active split plus ``BandOps``."""
    with splitting(group, band) as split, BandOps(split):
        yield split


def recompute_contexts() -> tuple[AbstractContextManager, AbstractContextManager]:
    """``context_fn`` for ``torch.utils.checkpoint`` that recomputes a block on the band it ran on; the
    backward pass, where recomputation runs, does not see the forward's ``TorchFunctionMode``."""
    split = active_split()
    return nullcontext(), nullcontext() if split is None else on_band(split.group, split.band)


def band_forward(
    model: BandSegmentor, images: Tensor, group: BandGroup, with_aux: bool = False, seed: int | None = None
) -> tuple[Tensor, Tensor | None, Band]:
    """Logits (and aux logits) of this process's band of ``images`` [B, 3, H, W], the same full batch on
    every process of ``group``: rows [band.start, min(band.stop, H)) of what ``model(images)`` returns.

    In training mode dropout and drop path draw from ``seed`` (default: the group's ``image_seed``), so every
    band makes the decisions one process would make for the whole image.
    """
    height, width = images.shape[-2:]
    band = image_bands(model, height, group.size)[group.index]
    # this band of the stride-padded image, without padding the whole image first
    stride = model.stride
    padded_width = (width + stride - 1) // stride * stride
    rows = images[:, :, band.start : min(band.stop, height)]
    padded = F.pad(rows, (0, padded_width - width, 0, band.rows - rows.shape[2]))
    training = getattr(model, "training", False)
    if training and seed is None:
        seed = image_seed(group, images.device)
    draws = drawing_from(seed, images.device) if training else nullcontext()
    with draws, on_band(group, band):
        logits, aux = model.padded_logits(padded, with_aux)
    keep = max(0, min(band.stop, height) - band.start)  # rows of the band inside the unpadded image
    logits = logits[:, :, :keep, :width]
    return logits, None if aux is None else aux[:, :, :keep, :width], band
