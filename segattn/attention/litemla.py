"""EfficientViT's lightweight multi-scale linear attention, LiteMLA (Cai et al. 2023, arXiv 2205.14756)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import Tensor, nn

from ..layers import HW, depthwise_conv, from_grid, to_grid
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

    Parameters: ``qkv`` (C→3C, no bias by default, [q | k | v] as in every variant), ``aggreg.i.0``
    (depthwise conv of scale i) and ``aggreg.i.1`` (1×1 conv, 3·heads groups of d channels), ``proj.0``
    ((1 + S)·C→C, no bias), ``proj.1`` (TokenBatchNorm). ``convert_timm_state_dict`` maps timm's LiteMLA
    onto them: timm orders the q, k, v channels per head ([q_h | k_h | v_h] for each head h).
    """

    triton_path: ClassVar[bool] = True

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

    def mix_tokens(self, q: Tensor, k: Tensor, v: Tensor, hw: HW) -> Tensor:
        """Multi-scale aggregation, then attention in every head of every scale; [B, N, C] q, k, v ->
        [B, N, (1 + S)·C] (everything between the projections, as ``bench op`` times it)."""
        qkv = torch.cat([q, k, v], dim=-1)  # [B, N, 3C]
        grid = to_grid(qkv, hw)  # [B, 3C, H, W], channels-last
        scales = [
            qkv,
            *(
                from_grid(pointwise(depthwise_conv(grid, depthwise, self.kernel_backend)))
                for depthwise, pointwise in self.aggreg
            ),
        ]
        mixed = []
        for tokens in scales:  # each scale's heads attend among themselves
            # [B, N, 3C] -> q, k, v [B, h, N, d] each
            q, k, v = (
                tokens.unflatten(-1, (3, self.num_heads, self.head_dim)).permute(2, 0, 3, 1, 4).unbind(0)
            )
            mixed.append(
                lite_linear_attention(q, k, v, self.kernel, self.eps, self.kernel_backend).transpose(1, 2)
            )  # [B, N, h, d]
        return torch.cat(mixed, dim=2).flatten(2)  # [B, N, (1 + S)·C], scale-major heads

    def convert_timm_state_dict(self, state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
        """A timm ``LiteMLA`` state dict (``qkv.conv``, ``aggreg``, ``proj.conv``, ``proj.norm``) → this
        module's: q, k, v channels regrouped from timm's per-head order to [q | k | v] (rows of ``qkv``
        and of both aggregation convs; a group of the grouped conv keeps its own d×d weight), 1×1 conv
        weights as linear ones."""
        # our channel (j, h, i) of q/k/v j, head h, channel i is timm's channel h·3d + j·d + i
        order = torch.arange(3 * self.dim).view(self.num_heads, 3, self.head_dim).transpose(0, 1).flatten()
        renames = {"qkv.conv.": "qkv.", "proj.conv.": "proj.0.", "proj.norm.": "proj.1."}
        out = {}
        for key, value in state_dict.items():
            for theirs, ours in renames.items():
                key = key.replace(theirs, ours)
            if key.startswith(("qkv.", "aggreg.")):
                value = value[order]
            out[key] = value.flatten(1) if key in ("qkv.weight", "proj.0.weight") else value
        return out

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, scales={self.scales}, kernel={self.kernel}"
