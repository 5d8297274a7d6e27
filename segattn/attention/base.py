"""The shared attention module: qkv projection, head split/merge and output projection, written once.

Subclasses supply only the mixing step. Parameter names (``qkv``: C→3C, ``proj``: C→C) match timm's
``Attention`` so ViT/DeiT weights load unchanged.
"""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor, nn

from ..layers import HW, kernel_backend


class AttentionBase(nn.Module):
    """Token mixer ``forward(x: [B, N, C], hw: (H, W)) -> [B, N, C]``; no residual inside.

    Class-level capability flags describe what the variant supports; they are checked by the tests and
    listed in the docs: ``onnx_dynamic`` (ONNX export with dynamic H, W), ``quadratic`` (memory grows with
    N²), ``max_tokens`` (None: any resolution), ``band_parallel`` (one image can be split into bands of rows
    across processes: every token interaction goes through the sums of ``segattn.parallel.tokens`` and
    every image operation through ``segattn.parallel.ops``), ``triton_path`` (its core has a Triton form).
    Every variant traces and compiles. ``kernel_backend``: the settings when it was built, for
    ``layers.choose_path`` (``layers.kernel_backend``: "plain", "auto", "torch" or "triton").
    """

    onnx_dynamic: ClassVar[bool] = True
    quadratic: ClassVar[bool] = False
    band_parallel: ClassVar[bool] = False
    triton_path: ClassVar[bool] = False

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = True, proj_drop: float = 0.0) -> None:
        super().__init__()
        if dim % num_heads != 0:
            raise ValueError(f"{type(self).__name__}: dim={dim} is not divisible by num_heads={num_heads}")
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.kernel_backend = kernel_backend()

    @property
    def max_tokens(self) -> int | None:
        """Largest token count the module accepts; None when any resolution works."""
        return None

    def forward(self, x: Tensor, hw: HW) -> Tensor:
        self.check_tokens(x, hw)
        q, k, v = self.project(x, hw)
        return self.proj_drop(self.proj(self.mix_tokens(q, k, v, hw)))

    def check_tokens(self, x: Tensor, hw: HW) -> None:
        """Fail with a clear message when the token count does not match the (H, W) grid."""
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(
                f"{type(self).__name__}: expected x of shape [B, N, {self.dim}], got {list(x.shape)}"
            )
        height, width = hw
        if x.shape[1] != height * width:
            raise ValueError(
                f"{type(self).__name__}: x has N={x.shape[1]} tokens but hw={tuple(hw)} "
                f"implies H*W={height * width}"
            )

    def project(self, x: Tensor, hw: HW) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys, values as [B, N, C] each (keys/values may have fewer tokens in subclasses)."""
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return q, k, v

    def mix_tokens(self, q: Tensor, k: Tensor, v: Tensor, hw: HW) -> Tensor:
        """[B, N, C] queries/keys/values -> mixed [B, N, C]; the default splits heads and calls ``mix``."""
        return self.merge_heads(self.mix(self.split_heads(q), self.split_heads(k), self.split_heads(v), hw))

    def mix(self, q: Tensor, k: Tensor, v: Tensor, hw: HW) -> Tensor:
        """The variant's math on [B, heads, N, d] tensors."""
        raise NotImplementedError

    def split_heads(self, x: Tensor) -> Tensor:
        # [B, N, C] -> [B, heads, N, d]
        batch, tokens, _ = x.shape
        return x.reshape(batch, tokens, self.num_heads, self.head_dim).transpose(1, 2)

    def merge_heads(self, x: Tensor) -> Tensor:
        # [B, heads, N, d] -> [B, N, C]
        batch, _, tokens, _ = x.shape
        return x.transpose(1, 2).reshape(batch, tokens, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}"


__all__ = ["AttentionBase"]
