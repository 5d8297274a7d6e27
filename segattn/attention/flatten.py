"""FLatten focused linear attention (Han et al. 2023, arXiv 2308.00442)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import HW, AttentionBase, from_grid, to_grid
from .functional import focused_feature_map, focused_linear_attention


class FocusedLinearAttention(AttentionBase):
    """Focused linear attention plus a depthwise conv on V that restores feature diversity.

    q, k ← relu(·) + 1e-6, divided by softplus(scale); then f_p (norm-preserving power p) over all C
    channels; then linear attention with φ = identity. Extra parameters beyond timm's Attention:
    ``scale`` ([C], init 0) and ``dwc`` (depthwise Conv2d on [B·heads, d, H, W], shared across heads).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = True,
        proj_drop: float = 0.0,
        focusing_factor: float = 3.0,
        kernel_size: int = 5,
        eps: float = 1e-6,
    ) -> None:
        super().__init__(dim, num_heads, qkv_bias, proj_drop)
        if kernel_size % 2 != 1:
            raise ValueError(f"FocusedLinearAttention: kernel_size={kernel_size}; expected an odd integer")
        self.focusing_factor = focusing_factor
        self.eps = eps
        self.scale = nn.Parameter(torch.zeros(dim))
        self.dwc = nn.Conv2d(
            self.head_dim, self.head_dim, kernel_size, padding=kernel_size // 2, groups=self.head_dim
        )

    def focus(self, x: Tensor) -> Tensor:
        """relu + 1e-6, divide by softplus(scale), then the focusing function f_p; [B, N, C]."""
        x = (F.relu(x) + 1e-6) / F.softplus(self.scale)
        return focused_feature_map(x, self.focusing_factor)

    def mix_tokens(self, q: Tensor, k: Tensor, v: Tensor, hw: HW) -> Tensor:
        q, k = self.focus(q), self.focus(k)
        v_heads = self.split_heads(v)  # [B, h, N, d]
        out = self.merge_heads(
            focused_linear_attention(self.split_heads(q), self.split_heads(k), v_heads, self.eps)
        )
        batch, heads, tokens, head_dim = v_heads.shape
        v_grid = to_grid(v_heads.reshape(batch * heads, tokens, head_dim), hw)  # [B·h, d, H, W]
        local = from_grid(self.dwc(v_grid)).reshape(batch, heads, tokens, head_dim)
        return out + self.merge_heads(local)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, focusing_factor={self.focusing_factor}"
