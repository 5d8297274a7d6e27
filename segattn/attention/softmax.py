"""Softmax attention through PyTorch SDPA, optionally with PVT's spatial reduction of keys/values."""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor

from ..layers import HW
from .functional import softmax_attention
from .reduction import ReducedKeysAttention


class SoftmaxAttention(ReducedKeysAttention):
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
        super().__init__(dim, num_heads, qkv_bias, proj_drop, sr_ratio)
        self.attn_drop = attn_drop

    def mix(self, q: Tensor, k: Tensor, v: Tensor, hw: HW) -> Tensor:
        return softmax_attention(q, k, v, dropout_p=self.attn_drop if self.training else 0.0)
