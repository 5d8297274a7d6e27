"""EfficientViT's lightweight multi-scale linear attention, LiteMLA (Cai et al. 2023, arXiv 2205.14756)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..layers import HW, from_grid, to_grid
from .base import AttentionBase
from .functional_lite import LITE_KERNELS, lite_linear_attention


class TokenBatchNorm(nn.BatchNorm1d):
    """BatchNorm over the channels of [B, N, C] tokens: statistics over all B·N tokens, as BatchNorm2d
    computes them over B·H·W pixels of the same map (same parameters and buffers)."""

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x.flatten(0, 1)).view_as(x)


class LiteMultiScaleAttention(AttentionBase):
    """LiteMLA: ReLU linear attention over the q, k, v tokens and their multi-scale aggregates.

    One projection gives q, k, v. For each size s in ``scales`` the q, k, v image also goes through a
    depthwise s×s conv and a 1×1 conv grouped per head and per q/k/v; every scale adds ``num_heads`` heads
    that attend among themselves (``num_heads · (1 + len(scales))`` heads in all), with
    ``lite_linear_attention``. Their outputs, concatenated, go through ``proj`` (a bias-free linear layer
    onto C channels, then BatchNorm). With no ``scales`` it is plain ReLU linear attention + proj.

    Heads: LiteMLA fixes the head width (8-32 channels) and derives the head count from the width; the zoo
    interface takes ``num_heads``. Both map cleanly: without ``head_dim`` the heads are ``dim // num_heads``
    wide, as in every variant; ``head_dim`` given overrides ``num_heads`` with ``dim // head_dim``. The
    efficientvit model passes ``num_heads = width // head_dim`` of its size, which is timm's head count.

    Parameters (timm's LiteMLA names after ``EfficientViT.convert_state_dict``): ``qkv`` (C→3C, no bias by
    default; channels grouped per head as [q_h, k_h, v_h], timm's order, not AttentionBase's [q | k | v]),
    ``aggreg.i.0`` (depthwise conv, scale i) and ``aggreg.i.1`` (grouped 1×1 conv), ``proj.0`` ((1 + S)·C→C,
    no bias), ``proj.1`` (TokenBatchNorm; in timm ``proj.conv`` and ``proj.norm``).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = False,
        proj_drop: float = 0.0,
        scales: Sequence[int] = (5,),
        head_dim: int | None = None,
        kernel: str = "relu",
        eps: float = 1e-5,
    ) -> None:
        if head_dim is not None:
            if head_dim <= 0 or dim % head_dim != 0:
                raise ValueError(
                    f"LiteMultiScaleAttention: head_dim={head_dim} does not divide dim={dim}; "
                    "expected a positive divisor of the width (e.g. 16 or 32), or null for dim // num_heads"
                )
            num_heads = dim // head_dim
        super().__init__(dim, num_heads, qkv_bias, proj_drop)
        bad = [s for s in scales if not isinstance(s, int) or s < 1 or s % 2 == 0]
        if bad:
            raise ValueError(
                f"LiteMultiScaleAttention: scales={list(scales)} has {bad}; expected odd kernel sizes "
                "≥ 1 (e.g. [5] or [3, 5]) so that each aggregation keeps the grid size"
            )
        if kernel not in LITE_KERNELS:
            raise ValueError(f"LiteMultiScaleAttention: kernel={kernel!r}; expected one of {LITE_KERNELS}")
        self.scales = list(scales)
        self.kernel = kernel
        self.eps = eps
        channels = 3 * dim
        self.aggreg = nn.ModuleList(
            nn.Sequential(
                nn.Conv2d(channels, channels, s, padding=s // 2, groups=channels, bias=qkv_bias),
                nn.Conv2d(channels, channels, 1, groups=3 * num_heads, bias=qkv_bias),
            )
            for s in self.scales
        )
        self.proj = nn.Sequential(
            nn.Linear(dim * (1 + len(self.scales)), dim, bias=False), TokenBatchNorm(dim)
        )

    def project(self, x: Tensor, hw: HW) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v as [B, N, C] each, from ``qkv``'s per-head [q_h | k_h | v_h] channel groups."""
        q, k, v = self.qkv(x).unflatten(-1, (self.num_heads, 3, self.head_dim)).unbind(-2)  # [B, N, h, d]
        return q.flatten(2), k.flatten(2), v.flatten(2)

    def mix_tokens(self, q: Tensor, k: Tensor, v: Tensor, hw: HW) -> Tensor:
        """Multi-scale aggregation, then attention in every head of every scale; [B, N, C] q, k, v ->
        [B, N, (1 + S)·C] (everything between the projections, as ``bench op`` times it)."""
        heads = (self.num_heads, self.head_dim)
        qkv = torch.stack([t.unflatten(-1, heads) for t in (q, k, v)], dim=-2).flatten(2)  # [B, N, 3C]
        grid = to_grid(qkv, hw)  # [B, 3C, H, W]
        tokens = torch.cat([qkv, *(from_grid(aggregate(grid)) for aggregate in self.aggreg)], dim=-1)
        # [B, N, (1 + S)·h, 3, d] -> q, k, v [B, (1 + S)·h, N, d] each
        q, k, v = tokens.unflatten(-1, (-1, 3, self.head_dim)).transpose(1, 2).unbind(-2)
        return lite_linear_attention(q, k, v, self.kernel, self.eps).transpose(1, 2).flatten(2)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, scales={self.scales}, kernel={self.kernel}"
