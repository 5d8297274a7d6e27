"""LayerNorm with a Triton operator for the narrow rows of high-resolution token maps."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .fast_path import TRITON, choose_path, kernel_backend, on_a_gpu

MAX_CHANNELS = 1024  # the widest rows the Triton operator's tile holds


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` over the last axis (same parameters, state_dict and values) that runs as one Triton
    operator where ``choose_path`` gives it (``kernel_backend``, read when built; CUDA tensors by default):
    ``layer_norm_triton``.

    Its output dtype under autocast is autocast's own (fp32 on CUDA, where LayerNorm is on autocast's fp32
    list; the input's on the CPU), except with ``feeds_matmul``: a norm read by matmuls or convs (a block's
    pre-norms; a PVT stage's closing norm, whose map the next stage's patch embedding and the heads'
    projections read, or resample first) writes the autocast dtype that they would cast it to, so neither the
    fp32 output nor the casts are written. A norm whose output starts a residual stream keeps it in fp32."""

    def __init__(
        self, normalized_shape: int, eps: float = 1e-5, feeds_matmul: bool = False, **kwargs
    ) -> None:
        super().__init__(normalized_shape, eps=eps, **kwargs)
        self.kernel_backend = kernel_backend()
        self.feeds_matmul = feeds_matmul

    def forward(
        self, x: Tensor, branch: Tensor | None = None, drop_path: nn.Module | None = None
    ) -> Tensor | tuple[Tensor, Tensor]:
        """LayerNorm of x; given a ``branch``, of a residual add: ``after_residual``."""
        if branch is not None:
            return self.after_residual(x, branch, nn.Identity() if drop_path is None else drop_path)
        if self.takes_triton(x):
            from . import layer_norm_triton  # noqa: F401  (imports triton; registers segattn::layer_norm)

            return torch.ops.segattn.layer_norm.default(
                x, self.weight, self.bias, self.eps, self.out_dtype(x)
            )[0]
        return super().forward(x)

    def after_residual(self, x: Tensor, branch: Tensor, drop_path: nn.Module) -> tuple[Tensor, Tensor]:
        """(s, this norm of s) for a block's residual add s = x + drop_path(branch), called as the module
        ``norm(x, branch, drop_path)`` (``bench traffic`` charges a module call's ops to it): one Triton
        operator (``residual_layer_norm``) where ``takes_triton`` takes the opt-in ``residual`` form for the
        pair, else the add and ``forward``. The operator takes drop_path's factor per image (timm's
        ``DropPath``: the same draw) as it multiplies a [B, 1, ...] tensor of ones; Identity or in eval:
        none."""
        fits = branch.shape == x.shape and torch.promote_types(x.dtype, branch.dtype) == x.dtype
        if not (fits and self.takes_residual(x)):
            summed = x + drop_path(branch)
            return summed, self(summed)
        from . import layer_norm_triton  # noqa: F401  (imports triton; registers segattn::residual_layer_norm)

        scale = None
        if drop_path.training and not isinstance(drop_path, nn.Identity):
            scale = drop_path(branch.new_ones(branch.shape[:1] + (1,) * (branch.ndim - 1))).flatten().float()
        summed, y, _, _ = torch.ops.segattn.residual_layer_norm.default(
            x, branch, scale, self.weight, self.bias, self.eps, self.out_dtype(x)
        )
        return summed, y

    def takes_residual(self, x: Tensor) -> bool:
        """Whether ``after_residual`` on ``x`` (and a branch of its shape, no wider dtype) takes the operator:
        ``takes_triton`` for the opt-in ``residual`` form."""
        return self.takes_triton(x, opt_in="residual")

    def out_dtype(self, x: Tensor) -> torch.dtype:
        """The operator's output dtype for ``x`` (see the class; CUDA's rule ``on_a_gpu``)."""
        device = x.device.type
        if not torch.is_autocast_enabled(device):
            return x.dtype
        if self.feeds_matmul:
            return torch.get_autocast_dtype(device)
        return torch.float32 if on_a_gpu(x) else x.dtype

    def takes_triton(self, x: Tensor, opt_in: str | None = None) -> bool:
        """Whether a call on ``x`` takes the operator: one normalised axis of at most ``MAX_CHANNELS``, with
        weight and bias, on ``choose_path``'s Triton path (for the form named ``opt_in``, if any)."""
        shaped = len(self.normalized_shape) == 1 and self.normalized_shape[0] <= MAX_CHANNELS
        affine = self.weight is not None and self.bias is not None
        path = choose_path(self.kernel_backend, x, triton_head_dim=1, function=False, opt_in=opt_in)
        return shaped and affine and path == TRITON
