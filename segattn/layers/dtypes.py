"""The dtype a matmul or convolution runs in: autocast's where autocast is on for its operand's device, else
the operand's own."""

from __future__ import annotations

import torch
from torch import Tensor


def matmul_dtype(x: Tensor) -> torch.dtype:
    """The dtype a matmul or convolution on ``x`` runs in (autocast's, else ``x``'s)."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype


def matmul_operand(x: Tensor) -> Tensor:
    """``x`` in ``matmul_dtype``: what a matmul on it would cast it to."""
    return x.to(matmul_dtype(x))
