"""``bench op``'s references: the floor passes a mode is compared with, the kernel products of a linear
attention alone (``matmuls``) and the copy bandwidth behind the copy floor (see ``op``)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch

from .measure import time_call

if TYPE_CHECKING:
    from .op import OpCase, OpSettings

COPY_BYTES = {"cuda": 1 << 30, "cpu": 1 << 28}  # per copy buffer: far past caches and launch costs


def floor_passes(mode: str) -> int:
    """Floor passes a mode is compared with: one forward, two forward+backward."""
    return 2 if mode == "fwdbwd" else 1


class MatmulFloor:
    """The batched matmuls of a kernel-product linear attention alone, on head-major fp32 operands."""

    def __init__(self, case: OpCase, heads: int) -> None:
        batch, tokens, dim = case.floor_out.shape
        d = dim // heads
        make = functools.partial(torch.randn, dtype=torch.float32, device=case.device)
        self.mode = case.mode
        self.queries, self.keys = make(batch * heads, tokens, d), make(batch * heads, tokens, d)
        self.values = make(batch * heads, tokens, d + 1)  # [V | 1]
        self.context = make(batch * heads, d, d + 1)
        self.out = make(batch * heads, tokens, d + 1)
        self.grad_out = make(batch * heads, tokens, d + 1)
        self.grad_tokens = make(batch * heads, tokens, d)

    def __call__(self) -> None:
        torch.bmm(self.keys.mT, self.values, out=self.context)
        torch.bmm(self.queries, self.context, out=self.out)
        if self.mode == "fwdbwd":
            grad_context = self.queries.mT @ self.grad_out
            torch.bmm(self.grad_out[..., :-1], self.context[..., :-1].mT, out=self.grad_tokens)
            torch.bmm(self.values, grad_context.mT, out=self.grad_tokens)
            torch.bmm(self.keys, grad_context[..., :-1], out=self.grad_tokens)


def copy_bandwidth(device: torch.device, settings: OpSettings) -> float:
    """Bytes per second (read + written) of the best of ``settings.repeats`` copies between two buffers of
    ``COPY_BYTES`` (fewer on a GPU with little free memory), timed like every op (CUDA events on a GPU)."""
    size = COPY_BYTES[device.type]
    if device.type == "cuda":
        size = min(size, torch.cuda.mem_get_info(device)[0] // 4)
    source = torch.ones(size, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    copy = functools.partial(target.copy_, source)
    copy()  # first touch outside the timing
    seconds = min(time_call(copy, device) for _ in range(max(3, settings.repeats)))
    return 2 * size / seconds


def moved_bytes(settings: OpSettings, tokens: int, mode: str, element_size: int) -> int:
    """What a linear attention must move: q, k, v in and o out (fwd); also dO in and dq, dk, dv out."""
    return 4 * floor_passes(mode) * settings.batch * tokens * settings.dim * element_size
