"""Buffer helpers shared by the autograd Functions of this package: the compute dtype, outputs allocated in
the caller's memory order, and the [B, h, N, d] ↔ [B·h, N, d] batching of the per-head matmuls."""

from __future__ import annotations

import torch
from torch import Tensor


def compute_dtype(*tensors: Tensor) -> torch.dtype:
    """float64 when any input is float64, else fp32 (bf16/fp16 inputs are computed in fp32)."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def empty_in_order(like: Tensor, dtype: torch.dtype) -> Tensor:
    """An empty tensor shaped like ``like`` whose memory follows ``like``'s stride order (e.g. a heads view
    of [B, N, C] gets [B, N, C] memory), so results land where the caller's next op reads them."""
    order = sorted(range(like.dim()), key=lambda i: -like.stride(i))
    buffer = torch.empty([like.shape[i] for i in order], dtype=dtype, device=like.device)
    return buffer if order == sorted(order) else buffer.permute([order.index(i) for i in range(like.dim())])


def zero_scalar(like: Tensor, dtype: torch.dtype) -> Tensor:
    """A 0-dim zero on ``like``'s device, made per call and never cached: a cached scalar could carry a
    fake/meta tensor mode into real calls."""
    return torch.zeros((), dtype=dtype, device=like.device)


def heads_batch(x: Tensor) -> Tensor:
    """[B, h, N, d] -> [B·h, N, d] for bmm (a view unless B > 1 and x is a strided heads view)."""
    return x.reshape(-1, *x.shape[-2:])
