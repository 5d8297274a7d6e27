"""Tokens ↔ image grid: the [B, N, C] token sequence and its [B, C, H, W] image, with (H, W) passed
explicitly (never inferred from N). Attention variants and encoders convert through these two only."""

from __future__ import annotations

import torch
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


def interpolation_matrix(size: int, out: int, like: Tensor) -> Tensor:
    """The [out, size] matrix of 1-D linear interpolation with half-pixel centres (``F.interpolate``'s
    ``align_corners=False``): output i samples input (i + ½)·size/out − ½, clamped to [0, size − 1]. At
    out = size it is the identity exactly. In ``like``'s dtype, computed in fp32 at least (bf16 holds no
    pixel index past 256); its weights at integer scale factors 2, 4 and 8 are exact in bf16."""
    dtype = torch.promote_types(like.dtype, torch.float32)
    source = ((torch.arange(out, device=like.device, dtype=dtype) + 0.5) * size / out - 0.5).clamp(min=0)
    low = source.floor()
    frac = (source - low)[:, None]
    low = low.long().clamp(max=size - 1)[:, None]
    high = (low + 1).clamp(max=size - 1)
    positions = torch.arange(size, device=like.device)
    return ((positions == low).to(dtype) * (1 - frac) + (positions == high).to(dtype) * frac).to(like.dtype)


def resample_grid(maps: Tensor, size: HW) -> Tensor:
    """Bilinear resampling (half-pixel centres, as ``F.interpolate`` with align_corners=False) of [..., h, w]
    maps to ``size`` as two interpolation matrices, R_H · map · R_Wᵀ: for many small maps resampled to a
    large grid (Agent attention's [heads, agents, 7, 7] biases) the matmul backward is several times cheaper
    on CPU than ``upsample_bilinear2d``'s; in the maps' dtype even under autocast. At the stored size both
    matrices are the identity, so the stored values come back exactly (no size test: an exported graph
    keeps resampling at any input size)."""
    with torch.autocast(maps.device.type, enabled=False):
        rows = interpolation_matrix(maps.shape[-2], size[0], maps)
        cols = interpolation_matrix(maps.shape[-1], size[1], maps)
        return rows @ maps @ cols.transpose(0, 1)


def resample_grid_embedding(embedding: Tensor, stored: HW, hw: HW) -> Tensor:
    """A learned per-position embedding [1, h·w, C] stored on the ``stored`` (h, w) grid, bilinearly resampled
    to ``hw`` (align_corners=False, as PVT v1 resamples its position embeddings): [1, H·W, C]. At the stored
    grid every sample falls on a stored value with weight 1, so the stored values come back exactly (no size
    test: an exported graph keeps resampling at any input size). ``F.interpolate`` itself, so a released
    model's resampled embeddings are PyTorch's bit for bit; ``resample_grid`` is the matrix form for many
    small maps (Agent attention's biases), equal to it within float rounding."""
    grid = to_grid(embedding, stored)  # [1, C, h, w]
    return from_grid(F.interpolate(grid, size=tuple(hw), mode="bilinear", align_corners=False))
