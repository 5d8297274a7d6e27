"""Performer's FAVOR+ positive random features as a feature map (``feature_maps.MapFunction``) with its
own backward, for ``kernel.KernelAttention``."""

from __future__ import annotations

import torch
from torch import Tensor

from .feature_maps import MapFunction


class PositiveRandomFeatures(MapFunction):
    """FAVOR+: φ(x) = m^-½ exp(s·ωᵀx − s²‖x‖²/2 − c) with s = d^-¼ and ω [m, d] a constant buffer; the
    stabiliser c (per query row, or over all keys of a head) is a constant for the gradient, since it
    cancels in the attention ratio. Backward: ∂x = s·(g⊙φ)ω − s²·x·Σ_m(g⊙φ)."""

    def __init__(self, projection: Tensor, scale: float, per_row: bool) -> None:
        self.projection, self.scale, self.per_row = projection, scale, per_row

    def forward(self, x: Tensor, dtype: torch.dtype) -> Tensor:
        x = x.to(dtype)
        logits = torch.matmul(x, self.projection.to(dtype).T.mul(self.scale))  # [B, h, N, m]
        logits.sub_(torch.linalg.vecdot(x, x).unsqueeze(-1).mul_(0.5 * self.scale**2))
        logits.sub_(logits.amax(dim=-1 if self.per_row else (-2, -1), keepdim=True))
        return logits.exp_().mul_(self.projection.shape[0] ** -0.5)

    def backward(self, x: Tensor, phi: Tensor, grad: Tensor, out: Tensor) -> None:
        weighted = grad.mul(phi)  # ∂L/∂logits
        grad_x = torch.matmul(weighted, self.projection.to(phi.dtype).mul(self.scale))
        norm_term = weighted.sum(dim=-1, keepdim=True).mul_(self.scale**2)
        out.copy_(grad_x.sub_(x.to(phi.dtype) * norm_term))
