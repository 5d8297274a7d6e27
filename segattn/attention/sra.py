"""PVT spatial-reduction attention (Wang et al. 2021, arXiv 2102.12122) as its own registry entry."""

from __future__ import annotations

from .softmax import SoftmaxAttention


class SpatialReductionAttention(SoftmaxAttention):
    """Softmax attention with K, V from a stride-R conv + LayerNorm of the grid: ``softmax`` with a default
    ``sr_ratio`` of 2. Cost O(N·N/R²); ``quadratic`` stays True (memory grows with N², N×N at R = 1)."""

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = True,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        sr_ratio: int = 2,
    ) -> None:
        super().__init__(dim, num_heads, qkv_bias, proj_drop, attn_drop, sr_ratio)
