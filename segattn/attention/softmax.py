"""Softmax attention through PyTorch SDPA, optionally with PVT's spatial reduction of keys/values."""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor, nn

from ..layers import HW, from_grid, to_grid
from .base import AttentionBase
from .functional import softmax_attention


class SoftmaxAttention(AttentionBase):
    """softmax(QKᵀ/√d)V, the quadratic baseline. ``sr_ratio > 1`` computes K, V from a strided conv +
    LayerNorm of the token grid (PVT's spatial-reduction attention, cost O(N²/R²)).

    Extra parameters when ``sr_ratio > 1``: ``sr`` (Conv2d C→C, kernel = stride = R) and ``norm``
    (LayerNorm C). The reduced grid needs H, W ≥ R.
    """

    quadratic: ClassVar[bool] = True

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = True,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        sr_ratio: int = 1,
    ) -> None:
        super().__init__(dim, num_heads, qkv_bias, proj_drop)
        if sr_ratio < 1:
            raise ValueError(f"{type(self).__name__}: sr_ratio={sr_ratio}; expected an integer >= 1")
        self.attn_drop = attn_drop
        self.sr_ratio = sr_ratio
        if sr_ratio > 1:
            self.sr = nn.Conv2d(dim, dim, kernel_size=sr_ratio, stride=sr_ratio)
            self.norm = nn.LayerNorm(dim)

    def project(self, x: Tensor, hw: HW) -> tuple[Tensor, Tensor, Tensor]:
        if self.sr_ratio == 1:
            return super().project(x, hw)
        if hw[0] < self.sr_ratio or hw[1] < self.sr_ratio:
            raise ValueError(
                f"{type(self).__name__}: token grid {tuple(hw)} is smaller than sr_ratio={self.sr_ratio}; "
                "use a larger image or a smaller sr_ratio"
            )
        w_q, w_kv = self.qkv.weight.split([self.dim, 2 * self.dim])
        b_q, b_kv = (None, None) if self.qkv.bias is None else self.qkv.bias.split([self.dim, 2 * self.dim])
        reduced = self.norm(from_grid(self.sr(to_grid(x, hw))))  # [B, N/R², C]
        k, v = nn.functional.linear(reduced, w_kv, b_kv).chunk(2, dim=-1)
        return nn.functional.linear(x, w_q, b_q), k, v

    def mix(self, q: Tensor, k: Tensor, v: Tensor, hw: HW) -> Tensor:
        return softmax_attention(q, k, v, dropout_p=self.attn_drop if self.training else 0.0)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, sr_ratio={self.sr_ratio}"
