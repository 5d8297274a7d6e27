"""FLatten focused linear attention (Han et al. 2023, arXiv 2308.00442)."""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..layers import FUNCTION, HW, PLAIN, choose_path, depthwise_conv, resample_grid_embedding
from .autograd.focus import focused_attention_function
from .functional import focused_feature_map, focused_linear_attention
from .reduction import ReducedKeysAttention
from .triton.functions import focused_attention_triton

POSITION_ENCODINGS = ("none", "learned")


class FocusedLinearAttention(ReducedKeysAttention):
    """Focused linear attention plus a depthwise conv on V that restores feature diversity.

    q, k ← relu(·) + 1e-6, divided by softplus(scale); then f_p (norm-preserving power p) over all C
    channels; then linear attention with φ = identity. Extra parameters beyond timm's Attention:
    ``scale`` ([C], init 0) and ``dwc`` (depthwise Conv2d on [B·heads, d, H, W], shared across heads).

    As in FLatten-PVT: ``sr_ratio`` R > 1 takes keys and values from the reduced grid (``sr``, ``norm``:
    ``ReducedKeysAttention``), and the DWC branch then runs on V bilinearly upsampled back to (H, W) (the
    official code interpolates the flattened token sequence in 1-D instead; no released checkpoint uses
    R > 1). ``position_encoding='learned'`` adds ``positional_encoding`` ([1, (S/R)², C], init 0; official
    name and layout), a learned encoding stored on the S/R × S/R grid (S = ``position_size``), to the keys
    before the focusing, resampled bilinearly to the key grid (the official code sizes it for 224² only).
    """

    band_parallel: ClassVar[bool] = True
    triton_path: ClassVar[bool] = True

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = True,
        proj_drop: float = 0.0,
        focusing_factor: float = 3.0,
        kernel_size: int = 5,
        eps: float = 1e-6,
        sr_ratio: int = 1,
        position_encoding: str = "none",
        position_size: int = 14,
    ) -> None:
        super().__init__(dim, num_heads, qkv_bias, proj_drop, sr_ratio)
        if kernel_size % 2 != 1:
            raise ValueError(f"FocusedLinearAttention: kernel_size={kernel_size}; expected an odd integer")
        self.focusing_factor = focusing_factor
        self.eps = eps
        self.scale = nn.Parameter(torch.zeros(dim))
        self.dwc = nn.Conv2d(
            self.head_dim, self.head_dim, kernel_size, padding=kernel_size // 2, groups=self.head_dim
        )
        if position_encoding not in POSITION_ENCODINGS:
            raise ValueError(
                f"FocusedLinearAttention: position_encoding={position_encoding!r}; "
                f"expected one of {POSITION_ENCODINGS}"
            )
        if position_size < sr_ratio:
            raise ValueError(
                f"FocusedLinearAttention: position_size={position_size}; expected an integer >= "
                f"sr_ratio={sr_ratio}"
            )
        self.position_size = position_size // sr_ratio
        learned = position_encoding == "learned"
        self.positional_encoding = (
            nn.Parameter(torch.zeros(1, self.position_size**2, dim)) if learned else None
        )

    def focus(self, x: Tensor) -> Tensor:
        """relu + 1e-6, divide by softplus(scale), then the focusing function f_p; [B, N, C]."""
        x = (F.relu(x) + 1e-6) / F.softplus(self.scale)
        return focused_feature_map(x, self.focusing_factor)

    def mix_tokens(self, q: Tensor, k: Tensor, v: Tensor, hw: HW) -> Tensor:
        kv_hw = self.reduced_hw(hw)
        if self.positional_encoding is not None:
            size = (self.position_size, self.position_size)
            k = k + resample_grid_embedding(self.positional_encoding, size, kv_hw)
        local = self.local_context(v, kv_hw, hw)  # [B, h, N, d]
        # focusing and kernel product in one autograd node or Triton operator: as many keys as queries
        whole = self.sr_ratio == 1
        path = choose_path(
            self.kernel_backend, q, triton_head_dim=self.head_dim if whole else None, function=whole
        )
        if path != PLAIN:
            return (focused_attention_function if path == FUNCTION else focused_attention_triton)(
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
        mixed = focused_linear_attention(q, k, self.split_heads(v), self.eps, self.kernel_backend)
        return self.merge_heads(mixed + local)

    def local_context(self, v: Tensor, kv_hw: HW, hw: HW) -> Tensor:
        """The DWC branch: each head's V as a d-channel image on ``kv_hw`` (bilinearly upsampled to ``hw``
        when keys/values are reduced) through the shared depthwise conv; [B, h, H·W, d].

        Run channels-last (image memory [B·h, H, W, d], weight too), the layout the head-major tokens already
        have, so neither direction needs a transpose (``depthwise_conv``).
        """
        batch = v.shape[0]
        images = self.split_heads(v).reshape(batch * self.num_heads, kv_hw[0], kv_hw[1], self.head_dim)
        images = images.permute(0, 3, 1, 2)  # [B·h, d, h', w'], channels-last
        if self.sr_ratio > 1:
            images = F.interpolate(images, size=tuple(hw), mode="bilinear", align_corners=False)
        local = depthwise_conv(images, self.dwc, self.kernel_backend)  # [B·h, d, H, W], channels-last
        return local.permute(0, 2, 3, 1).reshape(batch, self.num_heads, hw[0] * hw[1], self.head_dim)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, focusing_factor={self.focusing_factor}"
