"""Agent attention (Han et al., ECCV 2024, arXiv 2312.08874) with position biases defined on any grid."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from timm.layers import trunc_normal_
from torch import Tensor, nn

from ..layers import HW, depthwise_conv, from_grid, resample_grid, to_grid
from .functional_agent import AGENT_POOLINGS, agent_attention
from .reduction import ReducedKeysAttention

BLOCK_BIAS_SIZE = 7  # side of an_bias / na_bias, fixed in the official code


class AgentAttention(ReducedKeysAttention):
    """Queries attend to ``agent_num`` agent tokens pooled from the queries, which attend to the keys and
    values; plus a depthwise conv of V (``kernel_size``). O(N·n·d); keys/values reduced by ``sr_ratio``.

    Extra parameters beyond timm's Attention, named and shaped as in the official Agent-PVT (h heads,
    n agents, S = ``bias_size``, R = ``sr_ratio``): ``dwc`` (depthwise Conv2d C→C on V's grid), agent→key
    biases ``an_bias`` [h, n, 7, 7], ``ah_bias`` [1, h, n, S/R, 1], ``aw_bias`` [1, h, n, 1, S/R] and
    query→agent biases ``na_bias`` [h, n, 7, 7], ``ha_bias`` [1, h, S, 1, n], ``wa_bias`` [1, h, 1, S, n];
    with R > 1 also ``sr`` and ``norm``. The official code sizes the row/column biases by a fixed token
    count; here each is stored at base size S (S/R for keys) and resampled bilinearly to the actual grid
    (exactly the stored values at that size), as the 7×7 ones always are.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = True,
        proj_drop: float = 0.0,
        agent_num: int = 49,
        pooling: str = "grid",
        kernel_size: int = 3,
        bias_size: int = 14,
        sr_ratio: int = 1,
    ) -> None:
        super().__init__(dim, num_heads, qkv_bias, proj_drop, sr_ratio)
        name = type(self).__name__
        if pooling not in AGENT_POOLINGS:
            raise ValueError(f"{name}: pooling={pooling!r}; expected one of {AGENT_POOLINGS}")
        if agent_num < 1 or (pooling == "grid" and math.isqrt(agent_num) ** 2 != agent_num):
            raise ValueError(
                f"{name}: agent_num={agent_num}; pooling='grid' pools the query grid to √n×√n, so expected "
                "a perfect square (e.g. 9, 16, 49), or pooling='segments' for any n >= 1"
            )
        if kernel_size < 1 or kernel_size % 2 != 1:
            raise ValueError(f"{name}: kernel_size={kernel_size}; expected an odd integer >= 1")
        if bias_size < sr_ratio:
            raise ValueError(f"{name}: bias_size={bias_size}; expected an integer >= sr_ratio={sr_ratio}")
        self.agent_num = agent_num
        self.pooling = pooling
        self.dwc = nn.Conv2d(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim)
        heads, n, size, key_size = num_heads, agent_num, bias_size, bias_size // sr_ratio
        self.an_bias = nn.Parameter(torch.zeros(heads, n, BLOCK_BIAS_SIZE, BLOCK_BIAS_SIZE))
        self.na_bias = nn.Parameter(torch.zeros(heads, n, BLOCK_BIAS_SIZE, BLOCK_BIAS_SIZE))
        self.ah_bias = nn.Parameter(torch.zeros(1, heads, n, key_size, 1))
        self.aw_bias = nn.Parameter(torch.zeros(1, heads, n, 1, key_size))
        self.ha_bias = nn.Parameter(torch.zeros(1, heads, size, 1, n))
        self.wa_bias = nn.Parameter(torch.zeros(1, heads, 1, size, n))
        for bias in (self.an_bias, self.na_bias, self.ah_bias, self.aw_bias, self.ha_bias, self.wa_bias):
            trunc_normal_(bias, std=0.02)

    def agent_key_bias(self, hw: HW) -> Tensor:
        """Agent→key bias on the key grid ``hw``: [h, n, M]."""
        bias = (
            resample_grid(self.an_bias, hw)
            + resample_grid(self.ah_bias[0], (hw[0], 1))
            + resample_grid(self.aw_bias[0], (1, hw[1]))
        )  # [h, n, H, W]
        return bias.flatten(-2)

    def query_agent_bias(self, hw: HW) -> Tensor:
        """Query→agent bias on the query grid ``hw``: [h, N, n]."""
        bias = (
            resample_grid(self.na_bias, hw)
            + resample_grid(self.ha_bias[0].permute(0, 3, 1, 2), (hw[0], 1))
            + resample_grid(self.wa_bias[0].permute(0, 3, 1, 2), (1, hw[1]))
        )  # [h, n, H, W]
        return bias.flatten(-2).transpose(-2, -1)

    def mix_tokens(self, q: Tensor, k: Tensor, v: Tensor, hw: HW) -> Tensor:
        key_hw = self.reduced_hw(hw)
        out = agent_attention(
            self.split_heads(q),
            self.split_heads(k),
            self.split_heads(v),
            hw,
            self.agent_key_bias(key_hw),
            self.query_agent_bias(hw),
            self.agent_num,
            self.pooling,
        )
        values = to_grid(v, key_hw)  # [B, C, H/R, W/R]
        if self.sr_ratio > 1:  # the official code upsamples the reduced V before its conv
            values = F.interpolate(values, size=hw, mode="bilinear", align_corners=False)
        return self.merge_heads(out) + from_grid(depthwise_conv(values, self.dwc, self.kernel_backend))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, agent_num={self.agent_num}, pooling={self.pooling!r}"
