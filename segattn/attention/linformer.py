"""Linformer attention: keys, values projected along the sequence (Wang et al. 2020, arXiv 2006.04768)."""

from __future__ import annotations

import math
from typing import ClassVar

from torch import Tensor, nn

from ..layers import HW
from .base import AttentionBase
from .functional_approx import linformer_attention


class LinformerAttention(AttentionBase):
    """softmax(Q(EK)ᵀ/√d)(FV) with learned E, F: [proj_len, max_tokens], shared by all heads.

    The one variant tied to a resolution: E, F (extra parameters ``proj_e.weight``, ``proj_f.weight``; only
    ``proj_e`` with ``share_kv``) index flattened token positions, so a grid of N < max_tokens tokens uses
    their first N columns unchanged and more tokens are refused. Export at the training resolution.
    """

    onnx_dynamic: ClassVar[bool] = False

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = True,
        proj_drop: float = 0.0,
        max_tokens: int = 4096,
        proj_len: int = 256,
        share_kv: bool = False,
    ) -> None:
        super().__init__(dim, num_heads, qkv_bias, proj_drop)
        if max_tokens < 1 or proj_len < 1:
            raise ValueError(
                f"LinformerAttention: max_tokens={max_tokens}, proj_len={proj_len}; expected integers >= 1"
            )
        self.share_kv = share_kv
        self.proj_e = nn.Linear(max_tokens, proj_len, bias=False)
        self.proj_f = None if share_kv else nn.Linear(max_tokens, proj_len, bias=False)

    @property
    def max_tokens(self) -> int:
        """Largest token count (H·W) the learned sequence projections cover."""
        return self.proj_e.in_features

    def check_tokens(self, x: Tensor, hw: HW) -> None:
        super().check_tokens(x, hw)
        tokens, limit = x.shape[1], self.max_tokens
        if tokens > limit:
            side = math.isqrt(limit)
            raise ValueError(
                f"LinformerAttention: the {hw[0]}×{hw[1]} token grid has N={tokens} tokens, more than "
                f"max_tokens={limit} (about a {side}×{side} grid: {16 * side} px square images at patch "
                f"stride 16, {4 * side} px at stride 4). Use smaller images or raise the limit with "
                f"attention.options.max_tokens={tokens} (E and F grow with it; train at that size)."
            )

    def mix(self, q: Tensor, k: Tensor, v: Tensor, hw: HW) -> Tensor:
        proj_f = self.proj_e if self.proj_f is None else self.proj_f
        return linformer_attention(q, k, v, self.proj_e.weight, proj_f.weight)

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, max_tokens={self.max_tokens}, proj_len={self.proj_e.out_features}, "
            f"share_kv={self.share_kv}"
        )
