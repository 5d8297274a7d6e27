"""Tokens ↔ image grid: the [B, N, C] token sequence and its [B, C, H, W] image, with (H, W) passed
explicitly (never inferred from N). Attention variants and encoders convert through these two only."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

HW = tuple[int, int]


def to_grid(x: Tensor, hw: HW) -> Tensor:
    """[B, N, C] tokens -> a [B, C, H, W] channels-last view with the standard strides, batch stride H·W·C
    even at B = 1: convs given a size-1 batch with stride C run (and copy) NCHW."""
    return x.reshape(x.shape[0], hw[0], hw[1], x.shape[2]).permute(0, 3, 1, 2)


def from_grid(x: Tensor) -> Tensor:
    # [B, C, H, W] -> [B, N, C]
    return x.flatten(2).transpose(1, 2)


def resample_grid_embedding(embedding: Tensor, stored: HW, hw: HW) -> Tensor:
    """A learned per-position embedding [1, h·w, C] stored on the ``stored`` (h, w) grid, bilinearly resampled
    to ``hw`` (align_corners=False, as PVT v1 resamples its position embeddings): [1, H·W, C]. At the stored
    grid every sample falls on a stored value with weight 1, so the stored values come back exactly (no size
    test: an exported graph keeps resampling at any input size)."""
    grid = to_grid(embedding, stored)  # [1, C, h, w]
    return from_grid(F.interpolate(grid, size=tuple(hw), mode="bilinear", align_corners=False))
