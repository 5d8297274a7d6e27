"""Feature maps φ of the kernel attention Function (``kernel.KernelAttention``): forward into a fresh
head-major buffer in the compute dtype, backward writes ∂L/∂x into the caller's buffer.

Used by Efficient Attention (softmax, scaling), linear attention (elu + 1, relu), Taylor (L2 normalisation)
and FLatten's kernel product (identity); Performer's random features are in ``random_features``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .buffers import zero_scalar


class MapFunction:
    """A feature map φ of the PyTorch Function, applied per head on [B, h, N, d]; subclasses define the map
    and its vector-Jacobian product (``functional.FeatureMap.function_map`` builds them by name).

    ``saved``: keep φ(x) for backward (maps that cost several passes: exp, softmax, norms); otherwise it
    is recomputed from x (relu, scaling: one pass, and the memory stays free).
    """

    saved = True

    def forward(self, x: Tensor, dtype: torch.dtype) -> Tensor:
        raise NotImplementedError

    def backward(self, x: Tensor, phi: Tensor, grad: Tensor, out: Tensor) -> None:
        """Write ∂L/∂x into ``out`` given ``phi`` = φ(x) (left unchanged)."""
        raise NotImplementedError


class EluPlusOne(MapFunction):
    """elu(x) + 1 = exp(min(x, 0)) + max(x, 0), in elementwise passes that write φ once in ``dtype``."""

    def forward(self, x: Tensor, dtype: torch.dtype) -> Tensor:
        phi = torch.empty(x.shape, dtype=dtype, device=x.device)
        torch.minimum(x, zero_scalar(x, dtype), out=phi).exp_()
        return phi.add_(x.clamp(min=0))

    def backward(self, x: Tensor, phi: Tensor, grad: Tensor, out: Tensor) -> None:
        torch.mul(grad, phi.clamp(max=1), out=out)  # φ'(x) = exp(min(x, 0)) = min(φ(x), 1)


class Relu(MapFunction):
    """max(x, 0)."""

    saved = False

    def forward(self, x: Tensor, dtype: torch.dtype) -> Tensor:
        return torch.maximum(x, zero_scalar(x, dtype), out=torch.empty(x.shape, dtype=dtype, device=x.device))

    def backward(self, x: Tensor, phi: Tensor, grad: Tensor, out: Tensor) -> None:
        torch.ops.aten.threshold_backward.grad_input(grad, phi, 0, grad_input=out)  # grad where φ > 0


class Scale(MapFunction):
    """φ(x) = c·x (c = 1: identity)."""

    saved = False

    def __init__(self, factor: float) -> None:
        self.factor = factor

    def forward(self, x: Tensor, dtype: torch.dtype) -> Tensor:
        return torch.mul(x, self.factor, out=torch.empty(x.shape, dtype=dtype, device=x.device))

    def backward(self, x: Tensor, phi: Tensor, grad: Tensor, out: Tensor) -> None:
        torch.mul(grad, self.factor, out=out)


class L2Normalize(MapFunction):
    """x / max(‖x‖, eps) over the head's channels (F.normalize)."""

    def __init__(self, eps: float) -> None:
        self.eps = eps

    def forward(self, x: Tensor, dtype: torch.dtype) -> Tensor:
        # copy first: the norm then reduces over contiguous rows, not over the strided view of the heads
        phi = torch.empty(x.shape, dtype=dtype, device=x.device).copy_(x)
        return phi.div_(torch.linalg.vector_norm(phi, dim=-1, keepdim=True).clamp_min_(self.eps))

    def backward(self, x: Tensor, phi: Tensor, grad: Tensor, out: Tensor) -> None:
        # d(x/‖x‖) = (g − x̂ (x̂·g)) / ‖x‖ where ‖x‖ > eps; g / eps where the eps floor is active.
        scratch = torch.empty_like(phi).copy_(x)
        norm = torch.linalg.vector_norm(scratch, dim=-1, keepdim=True)
        along = torch.linalg.vecdot(phi, grad).unsqueeze(-1).mul_(norm > self.eps)
        torch.addcmul(grad, phi, along, value=-1, out=scratch)
        torch.div(scratch, norm.clamp_min_(self.eps), out=out)


class Softmax(MapFunction):
    """softmax over the head's channels (dim=-1) or over the tokens (dim=-2)."""

    def __init__(self, dim: int) -> None:
        self.dim = dim

    def forward(self, x: Tensor, dtype: torch.dtype) -> Tensor:
        return torch.softmax(x, dim=self.dim, dtype=dtype)

    def backward(self, x: Tensor, phi: Tensor, grad: Tensor, out: Tensor) -> None:
        # ∂x = φ ⊙ (g − Σ_dim g ⊙ φ) = g ⊙ φ − φ ⊙ Σ_dim(g ⊙ φ) in public ops (out= casts and takes any
        # strides), not the private torch._softmax_backward_data.
        weighted = grad * phi
        torch.addcmul(weighted, phi, weighted.sum(dim=self.dim, keepdim=True), value=-1, out=out)
