"""PolaFormer's polarity-aware linear attention (Meng et al., ICLR 2025, arXiv 2501.15061)."""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..layers import HW, TRITON, choose_path, depthwise_conv, resample_grid_embedding
from .functional_agent import pola_attention
from .reduction import ReducedKeysAttention
from .triton.functions import polarity_attention_triton

POSITION_ENCODINGS = ("none", "learned")


class PolaAttention(ReducedKeysAttention):
    """Polarity-aware linear attention: q, k divided by softplus(``scale``), split into positive and
    negative parts raised to a learned per-channel power p = 1 + ``alpha``·sigmoid(``power``) (3 at init
    with alpha 4); same-sign and opposite-sign interactions each fill half of every head's value channels
    (``pola_attention``). Then a depthwise conv of each head's V (``dwc``, shared across heads, odd
    ``kernel_size``) is added and the result multiplied by a gate computed from x (``gate``). Keys/values
    are reduced by ``sr_ratio``.

    Extra parameters beyond timm's Attention, official PolaFormer-PVT names and shapes: ``power``
    [1, h, 1, d] (init 0), ``scale`` [1, 1, C] (init 0), ``dwc`` (Conv2d d→d, groups d), ``gate``
    (Linear C→C: the second half of the official ``qg``), with ``position_encoding='learned'``
    ``positional_encoding`` [1, (S/R)², C] (init 0) added to k, stored on an S/R × S/R grid
    (S = ``position_size``) and resampled bilinearly to the key grid; with R > 1 also ``sr``, ``norm``.

    The polarity attention runs on the Triton kernels where ``layers.choose_path`` says so (its 2d-wide
    features within their head-dim limit); the scale, the power, the DWC and the gate stay in PyTorch.
    """

    triton_path: ClassVar[bool] = True

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = True,
        proj_drop: float = 0.0,
        alpha: float = 4.0,
        kernel_size: int = 5,
        position_encoding: str = "none",
        position_size: int = 14,
        sr_ratio: int = 1,
        eps: float = 1e-6,
    ) -> None:
        super().__init__(dim, num_heads, qkv_bias, proj_drop, sr_ratio)
        name = type(self).__name__
        if not alpha > 0:
            raise ValueError(f"{name}: alpha={alpha}; expected a number > 0 (the power is 1 + alpha·sigmoid)")
        if kernel_size < 1 or kernel_size % 2 != 1:
            raise ValueError(f"{name}: kernel_size={kernel_size}; expected an odd integer >= 1")
        if self.head_dim % 2 != 0:
            raise ValueError(
                f"{name}: head dim {self.head_dim} (dim={dim} / num_heads={num_heads}) is odd; the same- and "
                "opposite-sign halves need an even head dim"
            )
        if position_encoding not in POSITION_ENCODINGS:
            raise ValueError(
                f"{name}: position_encoding={position_encoding!r}; expected one of {POSITION_ENCODINGS}"
            )
        if position_size < sr_ratio:
            raise ValueError(
                f"{name}: position_size={position_size}; expected an integer >= sr_ratio {sr_ratio}"
            )
        self.alpha = alpha
        self.eps = eps
        self.gate = nn.Linear(dim, dim, bias=qkv_bias)
        self.power = nn.Parameter(torch.zeros(1, num_heads, 1, self.head_dim))
        self.scale = nn.Parameter(torch.zeros(1, 1, dim))
        self.dwc = nn.Conv2d(
            self.head_dim, self.head_dim, kernel_size, padding=kernel_size // 2, groups=self.head_dim
        )
        self.position_size = position_size // sr_ratio
        learned = position_encoding == "learned"
        self.positional_encoding = (
            nn.Parameter(torch.zeros(1, self.position_size**2, dim)) if learned else None
        )

    def forward(self, x: Tensor, hw: HW) -> Tensor:
        self.check_tokens(x, hw)
        q, k, v = self.project(x, hw)
        return self.proj_drop(self.proj(self.mix_tokens(q, k, v, hw) * self.gate(x)))

    def mix_tokens(self, q: Tensor, k: Tensor, v: Tensor, hw: HW) -> Tensor:
        key_hw = self.reduced_hw(hw)
        if self.positional_encoding is not None:
            stored = (self.position_size, self.position_size)
            k = k + resample_grid_embedding(self.positional_encoding, stored, key_hw)
        scale = F.softplus(self.scale)
        power = 1 + self.alpha * torch.sigmoid(self.power)
        heads = self.split_heads(q / scale), self.split_heads(k / scale), self.split_heads(v)
        # Triton or pola_attention, whose polarity features choose their PyTorch Function themselves
        path = choose_path(
            self.kernel_backend, heads[0], triton_head_dim=self.head_dim, widening=2, function=False
        )
        if path == TRITON:
            out = polarity_attention_triton(*heads, power.reshape(self.num_heads, self.head_dim), self.eps)
        else:
            out = pola_attention(*heads, power, self.eps, self.kernel_backend)
        return self.merge_heads(out) + self.local_context(v, hw)

    def local_context(self, v: Tensor, hw: HW) -> Tensor:
        """Each head's V as a d-channel image through the shared depthwise conv (the reduced V upsampled
        bilinearly to the query grid first when R > 1): [B, N, C]."""
        batch, heads, d = v.shape[0], self.num_heads, self.head_dim
        images = self.split_heads(v).reshape(batch * heads, *self.reduced_hw(hw), d).permute(0, 3, 1, 2)
        if self.sr_ratio > 1:
            images = F.interpolate(images, size=hw, mode="bilinear", align_corners=False)
        local = depthwise_conv(images, self.dwc, self.kernel_backend)  # [B·h, d, H, W]
        local = local.permute(0, 2, 3, 1).reshape(batch, heads, hw[0] * hw[1], d)
        return self.merge_heads(local)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, alpha={self.alpha}"
