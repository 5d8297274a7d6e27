"""Kernel linear attention (Katharopoulos et al. 2020, arXiv 2006.16236)."""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor

from ..layers import HW
from .base import AttentionBase
from .functional import LINEAR_FEATURE_MAPS, linear_attention


class LinearAttention(AttentionBase):
    """φ(Q)(φ(K)ᵀV) / (φ(Q)Σφ(K) + eps) with φ = elu + 1 (default) or relu."""

    band_parallel: ClassVar[bool] = True
    triton_path: ClassVar[bool] = True

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = True,
        proj_drop: float = 0.0,
        feature_map: str = "elu",
        eps: float = 1e-6,
    ) -> None:
        super().__init__(dim, num_heads, qkv_bias, proj_drop)
        if feature_map not in LINEAR_FEATURE_MAPS:
            raise ValueError(
                f"LinearAttention: feature_map={feature_map!r}; expected one of {LINEAR_FEATURE_MAPS}"
            )
        self.feature_map = feature_map
        self.eps = eps

    def forward(self, x: Tensor, hw: HW) -> Tensor:
        """``AttentionBase.forward`` with the qkv projection handed to ``mix_tokens`` whole: the Triton
        kernels read q, k, v as its column blocks and write one ∂qkv (autograd concatenates no ∂q, ∂k, ∂v)."""
        self.check_tokens(x, hw)
        return self.proj_drop(self.proj(self.mix_tokens(self.qkv(x), None, None, hw)))

    def mix_tokens(self, q: Tensor, k: Tensor | None, v: Tensor | None, hw: HW) -> Tensor:
        """[B, N, C] in and out: the Triton kernels read the heads through strides (no views around them);
        or q the [B, N, 3C] qkv, k and v None (``run_kernel_core``)."""
        return linear_attention(q, k, v, self.feature_map, self.eps, self.kernel_backend, self.num_heads)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, feature_map={self.feature_map}"
