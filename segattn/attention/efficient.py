"""Efficient Attention (Shen et al. 2018, arXiv 1812.01243)."""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor

from ..layers import HW
from .base import AttentionBase
from .functional import EFFICIENT_NORMALIZATIONS, efficient_attention


class EfficientAttention(AttentionBase):
    """ρq(Q)·(ρk(K)ᵀV) per head; ``normalization`` is ``softmax`` (default) or ``scale`` (= QKᵀV/N)."""

    band_parallel: ClassVar[bool] = True
    triton_path: ClassVar[bool] = True

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = True,
        proj_drop: float = 0.0,
        normalization: str = "softmax",
    ) -> None:
        super().__init__(dim, num_heads, qkv_bias, proj_drop)
        if normalization not in EFFICIENT_NORMALIZATIONS:
            raise ValueError(
                f"EfficientAttention: normalization={normalization!r}; "
                f"expected one of {EFFICIENT_NORMALIZATIONS}"
            )
        self.normalization = normalization

    def mix(self, q: Tensor, k: Tensor, v: Tensor, hw: HW) -> Tensor:
        return efficient_attention(q, k, v, self.normalization, self.kernel_backend)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, normalization={self.normalization}"
