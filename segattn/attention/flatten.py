"""FLatten focused linear attention (Han et al. 2023, arXiv 2308.00442)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..layers import HW, depthwise_conv, use_fused
from .base import AttentionBase
from .functional import focused_feature_map, focused_linear_attention
from .fused_focus import focused_attention_fused


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
        local = self.local_context(v, hw)  # [B, h, N, d]
        if use_fused():  # one autograd node; the focused maps are recomputed in backward
            return focused_attention_fused(
                q,
                k,
                v,
                local=local,
                scale=self.scale,
                power=self.focusing_factor,
                eps=self.eps,
                heads=self.num_heads,
            )
        q, k = self.split_heads(self.focus(q)), self.split_heads(self.focus(k))
        return self.merge_heads(focused_linear_attention(q, k, self.split_heads(v), self.eps) + local)

    def local_context(self, v: Tensor, hw: HW) -> Tensor:
        """The DWC branch: each head's V as a d-channel image through the shared depthwise conv; [B, h, N, d].

        Run channels-last (image memory [B·h, H, W, d], weight too): several times faster than NCHW here,
        and the head-major result needs no transpose (``depthwise_conv``).
        """
        batch, tokens, _ = v.shape
        images = self.split_heads(v).reshape(batch * self.num_heads, hw[0], hw[1], self.head_dim)
        local = depthwise_conv(images.permute(0, 3, 1, 2), self.dwc)  # [B·h, d, H, W], channels-last
        return local.permute(0, 2, 3, 1).reshape(batch, self.num_heads, tokens, self.head_dim)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, focusing_factor={self.focusing_factor}"
