"""Reductions over all tokens of the image, for the attention functional core.

Outside a split each is the plain local operation. Inside one (``bands.splitting``) the local result over
this band's tokens is combined over the band group: one all-reduce of the d×d key summary per attention
layer is all linear attention needs, because its outputs depend on the other tokens only through such sums.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from .bands import active_split
from .collectives import group_max, group_sum, group_sum_


def token_reducer() -> Callable[[Tensor], Tensor]:
    """A function that sums a tensor of sums over this band's tokens over the whole image, in place and
    outside autograd (identity outside a split). The autograd Functions capture it in forward, so their
    backward, which runs after the split has ended, can sum the summaries' gradients with it."""
    split = active_split()
    if split is None:
        return lambda x: x
    return lambda x: group_sum_(x, split.group)


def token_sum(x: Tensor) -> Tensor:
    """``x``, a sum over this process's tokens, summed over the whole image (differentiable)."""
    split = active_split()
    return x if split is None else group_sum(x, split.group)


def token_count(local: int) -> int:
    """The number of tokens of the whole image at the grid where this band has ``local`` tokens."""
    split = active_split()
    return local if split is None else split.band.global_count(local)


def token_max(x: Tensor) -> Tensor:
    """``x``, a max over this process's tokens, maxed over the whole image; only for shifts that cancel
    (no gradient flows through the other bands' maxima)."""
    split = active_split()
    return x if split is None else group_max(x, split.group)


def token_softmax(x: Tensor, dim: int = -2) -> Tensor:
    """Softmax along the token dimension ``dim`` over the whole image."""
    if active_split() is None:
        return x.softmax(dim=dim)
    shifted = (x - token_max(x.amax(dim=dim, keepdim=True))).exp()
    return shifted / token_sum(shifted.sum(dim=dim, keepdim=True))
