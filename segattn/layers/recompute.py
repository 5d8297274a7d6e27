"""What a recompute in backward reads: gradient checkpointing recomputes a segment of the model in backward
for what its operators saved, and throws away what the segment returns. A module knows whether its return is
thrown away (``return_unread``); an autograd Function that saves its inputs may then return a ``placeholder``
instead of computing its output. A small value the forward computed can be given back to the recompute
rather than computed again (``reused``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
from torch import Tensor

UNREAD: ContextVar[object | None] = ContextVar("UNREAD", default=None)  # set by ``unread_return``
REUSED: ContextVar[Reused | None] = ContextVar("REUSED", default=None)  # set by ``Reused``'s contexts


def return_unread(module: object) -> bool:
    """Whether what ``module`` returns now goes unread: it is being recomputed in backward
    (``models.blocks.recompute_in_backward``), or its caller passed this on (``unread_return``). An autograd
    Function that saves its inputs may then skip computing its output; an operator that saves its output
    may not. Never under ``torch.compile``, whose graphs recompute their own way."""
    return not torch.compiler.is_compiling() and UNREAD.get() is module


@contextmanager
def unread_return(module: object) -> Iterator[None]:
    """``return_unread(module)`` inside."""
    token = UNREAD.set(module)
    try:
        yield
    finally:
        UNREAD.reset(token)


def placeholder(shape: tuple[int, ...], like: Tensor, dtype: torch.dtype) -> Tensor:
    """An output nobody reads, of ``shape`` and ``dtype`` on ``like``'s device: one zero, expanded, so it
    takes no memory and writes nothing."""
    return like.new_zeros((), dtype=dtype).expand(shape)


class Reused:
    """The values one checkpointed segment's forward computes through ``reused``, given back in the same order
    to its recompute in backward (``models.blocks.recompute_in_backward`` makes one per segment)."""

    def __init__(self) -> None:
        self.kept: list[Any] = []
        self.replay: int | None = None  # the next value's index while replaying

    @contextmanager
    def recording(self) -> Iterator[None]:
        token = REUSED.set(self)
        try:
            yield
        finally:
            REUSED.reset(token)

    @contextmanager
    def replaying(self) -> Iterator[None]:
        self.replay = 0
        try:
            with self.recording():
                yield
        finally:  # also when the recompute stops early, once it has what backward needs
            self.replay = None


def reused(compute: Callable[[], Any]) -> Any:
    """``compute()``; in a checkpointed segment's forward it is kept, and its recompute in backward gets it
    back instead of computing it again. For small values the recompute would compute the same way (a
    BatchNorm's batch statistics); never under ``torch.compile``."""
    values = REUSED.get()
    if values is None or torch.compiler.is_compiling():
        return compute()
    if values.replay is None:
        values.kept.append(compute())
        return values.kept[-1]
    values.replay += 1
    return values.kept[values.replay - 1]
