"""Taylor linear attention (Li et al. 2020, arXiv 2007.14902)."""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor

from ..layers import HW
from .base import AttentionBase
from .functional import taylor_attention


class TaylorAttention(AttentionBase):
    """First-order Taylor expansion of exp(q̂ᵀk̂) with L2-normalised q, k: sim = 1 + q̂ᵀk̂ ≥ 0."""

    band_parallel: ClassVar[bool] = True
    triton_path: ClassVar[bool] = True

    def __init__(
        self, dim: int, num_heads: int = 8, qkv_bias: bool = True, proj_drop: float = 0.0, eps: float = 1e-6
    ) -> None:
        super().__init__(dim, num_heads, qkv_bias, proj_drop)
        self.eps = eps

    def mix(self, q: Tensor, k: Tensor, v: Tensor, hw: HW) -> Tensor:
        return taylor_attention(q, k, v, self.eps, self.kernel_backend)
