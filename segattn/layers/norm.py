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
    list; the input's on the CPU), except with ``feeds_matmul``: a norm read only by a matmul or conv (a
    block's pre-norms) writes the autocast dtype that matmul would cast it to, so neither the fp32 output nor
    the cast is written. A norm whose output starts a residual stream keeps it in fp32."""

    def __init__(
        self, normalized_shape: int, eps: float = 1e-5, feeds_matmul: bool = False, **kwargs
    ) -> None:
        super().__init__(normalized_shape, eps=eps, **kwargs)
        self.kernel_backend = kernel_backend()
        self.feeds_matmul = feeds_matmul

    def forward(self, x: Tensor) -> Tensor:
        if self.takes_triton(x):
            from . import layer_norm_triton  # noqa: F401  (imports triton; registers segattn::layer_norm)

            return torch.ops.segattn.layer_norm.default(
                x, self.weight, self.bias, self.eps, self.out_dtype(x)
            )[0]
        return super().forward(x)

    def out_dtype(self, x: Tensor) -> torch.dtype:
        """The operator's output dtype for ``x`` (see the class; CUDA's rule ``on_a_gpu``)."""
        device = x.device.type
        if not torch.is_autocast_enabled(device):
            return x.dtype
        if self.feeds_matmul:
            return torch.get_autocast_dtype(device)
        return torch.float32 if on_a_gpu(x) else x.dtype

    def takes_triton(self, x: Tensor) -> bool:
        """Whether a call on ``x`` takes the operator: one normalised axis of at most ``MAX_CHANNELS``, with
        weight and bias, on ``choose_path``'s Triton path."""
        shaped = len(self.normalized_shape) == 1 and self.normalized_shape[0] <= MAX_CHANNELS
        affine = self.weight is not None and self.bias is not None
        path = choose_path(self.kernel_backend, x, triton_head_dim=1, function=False)
        return shaped and affine and path == TRITON
