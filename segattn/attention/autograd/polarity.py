"""PolaFormer's polarity feature map [φ(x), φ(−x)], φ(x) = relu(x)^p, as one autograd node.

Autograd of the plain formula (``functional_agent.polarity_features``) runs ``pow``'s generic backward for
base and exponent (a second power, a log, masks for zero bases) on every [B, h, N, d] element, about as
many passes as the attention's matmuls cost. Here the backward reuses one recomputed |x|^p:
∂/∂x |x|^p = p·|x|^p / x (0 at x = 0, where p > 1) and ∂/∂p |x|^p = |x|^p·ln|x| (0 at x = 0).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable


class PolarityFeatures(torch.autograd.Function):
    """[φ(x), φ(−x)] along the last dim of x [..., d]; ``power`` > 0, broadcastable to x."""

    @staticmethod
    def forward(ctx, x: Tensor, power: Tensor) -> Tensor:
        ctx.save_for_backward(x, power)
        magnitude = x.abs() ** power
        positive = torch.where(x > 0, magnitude, 0.0)
        return torch.cat([positive, magnitude - positive], dim=-1)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None]:
        x, power = ctx.saved_tensors
        return polarity_backward(x, power, grad, *ctx.needs_input_grad)


def polarity_backward(
    x: Tensor, power: Tensor, grad: Tensor, needs_x: bool = True, needs_power: bool = True
) -> tuple[Tensor | None, Tensor | None]:
    """∂x and ∂power (summed to power's shape) from ∂[φ(x), φ(−x)] (``grad``, [..., 2d]); None where not
    needed. Shared by ``PolarityFeatures`` and the Triton path, whose kernels return ∂φ."""
    magnitude = x.abs() ** power
    grad_positive, grad_negative = grad.chunk(2, dim=-1)
    weighted = torch.where(x > 0, grad_positive, grad_negative) * magnitude  # 0 where x = 0
    grad_x = grad_power = None
    if needs_x:
        grad_x = weighted * power / torch.where(x == 0, 1.0, x)
    if needs_power:
        log_abs = x.abs().clamp(min=torch.finfo(x.dtype).tiny).log()  # finite: weighted is 0 at x = 0
        grad_power = (weighted * log_abs).sum_to_size(power.shape)
    return grad_x, grad_power


def polarity_features_function(x: Tensor, power: Tensor) -> Tensor:
    """``PolarityFeatures`` on x [..., d]: [..., 2d]."""
    return PolarityFeatures.apply(x, power)
