"""The band group's communication, all through torch.distributed (gloo on CPU, NCCL on GPUs).

``group_sum`` is a differentiable all-reduce (its backward all-reduces the gradient, so every band's
contribution reaches every band that used the sum). ``exchange_halos`` swaps edge rows with the bands
above and below by point-to-point messages; its backward sends each halo's gradient back to its owner.
Over gloo, which sends and receives CPU tensors only, CUDA halos travel through host copies (several band
processes sharing one GPU, as ``bench maxres spatial=[2] device=cuda`` runs them).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from .bands import BandGroup

# Bytes this process has sent through the band group's collectives since last cleared, by kind: the
# communication per step that ``bench maxres spatial=[...]`` reports.
TRAFFIC: dict[str, int] = {"all_reduce": 0, "halo": 0}


def _count(kind: str, *tensors: Tensor) -> None:
    TRAFFIC[kind] += sum(t.numel() * t.element_size() for t in tensors)


class GroupSum(torch.autograd.Function):
    """All-reduce (sum) whose backward is the all-reduce (sum) of the output's gradient: the sum feeds
    every band's loss, so each input's gradient is the sum of all bands' gradients."""

    @staticmethod
    def forward(ctx, x: Tensor, group: BandGroup) -> Tensor:
        ctx.group = group
        out = x.clone(memory_format=torch.contiguous_format)
        _count("all_reduce", out)
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group.group)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        return GroupSum.apply(grad, ctx.group), None


def group_sum(x: Tensor, group: BandGroup) -> Tensor:
    """Σ over the band group of ``x`` (same shape on every band), differentiable."""
    return GroupSum.apply(x, group)


def group_sum_(x: Tensor, group: BandGroup) -> Tensor:
    """``x`` summed over the band group in place, outside autograd (for autograd Functions' own passes)."""
    _count("all_reduce", x)
    dist.all_reduce(x, op=dist.ReduceOp.SUM, group=group.group)
    return x


def group_max(x: Tensor, group: BandGroup) -> Tensor:
    """Elementwise max over the band group, without gradient (used only as a constant shift)."""
    out = x.detach().clone(memory_format=torch.contiguous_format)
    dist.all_reduce(out, op=dist.ReduceOp.MAX, group=group.group)
    return out


def _swap(sends: list[tuple[Tensor, int]], recvs: list[tuple[Tensor, int]], group: BandGroup) -> None:
    _count("halo", *(tensor for tensor, _ in sends))
    staged = [(tensor, tensor.cpu()) for tensor, _ in recvs if _through_host(tensor, group)]
    host = {id(tensor): copy for tensor, copy in staged}
    sends = [(tensor.cpu() if _through_host(tensor, group) else tensor, peer) for tensor, peer in sends]
    recvs = [(host.get(id(tensor), tensor), peer) for tensor, peer in recvs]
    ops = [dist.P2POp(dist.isend, tensor, peer, group.group) for tensor, peer in sends]
    ops += [dist.P2POp(dist.irecv, tensor, peer, group.group) for tensor, peer in recvs]
    if ops:
        for request in dist.batch_isend_irecv(ops):
            request.wait()
    for tensor, copy in staged:
        tensor.copy_(copy)


def _through_host(tensor: Tensor, group: BandGroup) -> bool:
    """Whether a point-to-point message must go through a CPU copy: a CUDA tensor over gloo."""
    return tensor.is_cuda and dist.get_backend(group.group) == dist.Backend.GLOO


class HaloExchange(torch.autograd.Function):
    """(x [B, C, h, W], top, bottom) → (the ``top`` last rows of the band above, the ``bottom`` first rows of
    the band below); a side with no neighbour (the image edge) gives 0 rows."""

    @staticmethod
    def forward(ctx, x: Tensor, top: int, bottom: int, group: BandGroup) -> tuple[Tensor, Tensor]:
        ctx.group, ctx.top, ctx.bottom, ctx.rows = group, top, bottom, x.shape[2]
        batch, channels, _, width = x.shape
        above = x.new_empty(batch, channels, top if group.above is not None else 0, width)
        below = x.new_empty(batch, channels, bottom if group.below is not None else 0, width)
        sends, recvs = [], []
        if group.above is not None:
            sends.append((x[:, :, :bottom].contiguous(), group.above))  # the band above needs my first rows
            recvs.append((above, group.above))
        if group.below is not None:
            sends.append((x[:, :, x.shape[2] - top :].contiguous(), group.below))
            recvs.append((below, group.below))
        _swap(sends, recvs, group)
        return above, below

    @staticmethod
    def backward(ctx, grad_above: Tensor, grad_below: Tensor):
        group, top, bottom, rows = ctx.group, ctx.top, ctx.bottom, ctx.rows
        batch, channels, _, width = grad_above.shape
        grad = grad_above.new_zeros(batch, channels, rows, width)
        from_above = grad.new_empty(batch, channels, bottom, width)  # for my first rows
        from_below = grad.new_empty(batch, channels, top, width)  # for my last rows
        sends, recvs = [], []
        if group.above is not None:
            sends.append((grad_above.contiguous(), group.above))
            recvs.append((from_above, group.above))
        if group.below is not None:
            sends.append((grad_below.contiguous(), group.below))
            recvs.append((from_below, group.below))
        _swap(sends, recvs, group)
        if group.above is not None:
            grad[:, :, :bottom] += from_above
        if group.below is not None:
            grad[:, :, rows - top :] += from_below
        return grad, None, None, None


def exchange_halos(x: Tensor, top: int, bottom: int, group: BandGroup) -> tuple[Tensor, Tensor]:
    """The halo rows of band ``x`` [B, C, h, W]: ``top`` rows from the band above and ``bottom`` from the band
    below (0 at the image's edges); a band thinner than a halo is a ValueError."""
    if x.shape[2] < max(top, bottom):
        raise ValueError(
            f"a band of {x.shape[2]} rows cannot give a halo of {max(top, bottom)} rows to its neighbours; "
            "use a taller image or fewer bands"
        )
    return HaloExchange.apply(x, top, bottom, group)
