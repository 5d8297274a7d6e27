"""PVT's spatial reduction of keys/values (Wang et al. 2021), shared by the variants taking ``sr_ratio``."""

from __future__ import annotations

from torch import Tensor, nn

from ..layers import HW, LayerNorm, from_grid, to_grid
from .base import AttentionBase


class ReducedKeysAttention(AttentionBase):
    """``AttentionBase`` whose keys and values come from a stride-R conv + LayerNorm of the token grid when
    ``sr_ratio`` R > 1 (queries stay at full resolution): N/R² keys, on the ⌊H/R⌋×⌊W/R⌋ grid ``reduced_hw``.

    Extra parameters when R > 1: ``sr`` (Conv2d C→C, kernel = stride = R) and ``norm`` (LayerNorm C), the
    names of PVT and of the Agent-PVT / PolaFormer-PVT releases. The reduced grid needs H, W ≥ R.
    """

    def __init__(
        self, dim: int, num_heads: int = 8, qkv_bias: bool = True, proj_drop: float = 0.0, sr_ratio: int = 1
    ) -> None:
        super().__init__(dim, num_heads, qkv_bias, proj_drop)
        if sr_ratio < 1:
            raise ValueError(f"{type(self).__name__}: sr_ratio={sr_ratio}; expected an integer >= 1")
        self.sr_ratio = sr_ratio
        if sr_ratio > 1:
            self.sr = nn.Conv2d(dim, dim, kernel_size=sr_ratio, stride=sr_ratio)
            self.norm = LayerNorm(dim, feeds_matmul=True)  # into the key/value projection

    def reduced_hw(self, hw: HW) -> HW:
        """The key/value grid: (H, W) at R = 1, else (⌊H/R⌋, ⌊W/R⌋) as the stride-R conv makes it."""
        return hw if self.sr_ratio == 1 else (hw[0] // self.sr_ratio, hw[1] // self.sr_ratio)

    def project(self, x: Tensor, hw: HW) -> tuple[Tensor, Tensor, Tensor]:
        if self.sr_ratio == 1:
            return super().project(x, hw)
        if hw[0] < self.sr_ratio or hw[1] < self.sr_ratio:
            raise ValueError(
                f"{type(self).__name__}: token grid {tuple(hw)} is smaller than sr_ratio={self.sr_ratio}; "
                "use a larger image or a smaller sr_ratio"
            )
        w_q, w_kv = self.qkv.weight.split([self.dim, 2 * self.dim])
        b_q, b_kv = (None, None) if self.qkv.bias is None else self.qkv.bias.split([self.dim, 2 * self.dim])
        reduced = self.norm(from_grid(self.sr(to_grid(x, hw))))  # [B, N/R², C]
        k, v = nn.functional.linear(reduced, w_kv, b_kv).chunk(2, dim=-1)
        return nn.functional.linear(x, w_q, b_q), k, v

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, sr_ratio={self.sr_ratio}"
