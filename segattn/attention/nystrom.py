"""Nyströmformer: softmax attention through segment-mean landmarks (Xiong et al. 2021, arXiv 2102.03902)."""

from __future__ import annotations

from torch import Tensor, nn

from ..layers import HW, depthwise_conv, from_grid, to_grid
from .base import AttentionBase
from .functional_approx import nystrom_attention


class NystromAttention(AttentionBase):
    """Nyström approximation of softmax attention with ``num_landmarks`` segment-mean landmarks and an
    iterative pseudo-inverse (``pinv_iterations``), plus a depthwise conv residual on V.

    The paper's residual is a 1D depthwise conv along the token sequence; on images it is a depthwise
    ``conv_kernel``×``conv_kernel`` Conv2d over the (H, W) grid of V's C channels (extra parameter
    ``conv``; 0 = off).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = True,
        proj_drop: float = 0.0,
        num_landmarks: int = 64,
        pinv_iterations: int = 6,
        conv_kernel: int = 3,
    ) -> None:
        super().__init__(dim, num_heads, qkv_bias, proj_drop)
        if num_landmarks < 1 or pinv_iterations < 1:
            raise ValueError(
                f"NystromAttention: num_landmarks={num_landmarks}, pinv_iterations={pinv_iterations}; "
                "expected integers >= 1"
            )
        if conv_kernel < 0 or (conv_kernel > 0 and conv_kernel % 2 == 0):
            raise ValueError(
                f"NystromAttention: conv_kernel={conv_kernel}; expected 0 (off) or an odd integer"
            )
        self.num_landmarks = num_landmarks
        self.pinv_iterations = pinv_iterations
        self.conv = (
            nn.Conv2d(dim, dim, conv_kernel, padding=conv_kernel // 2, groups=dim) if conv_kernel else None
        )

    def mix(self, q: Tensor, k: Tensor, v: Tensor, hw: HW) -> Tensor:
        return nystrom_attention(q, k, v, self.num_landmarks, self.pinv_iterations)

    def mix_tokens(self, q: Tensor, k: Tensor, v: Tensor, hw: HW) -> Tensor:
        out = super().mix_tokens(q, k, v, hw)
        if self.conv is None:
            return out
        local = depthwise_conv(to_grid(v, hw), self.conv, self.kernel_backend)  # on V's grid, channels-last
        return out + from_grid(local)

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, num_landmarks={self.num_landmarks}, "
            f"pinv_iterations={self.pinv_iterations}"
        )
