"""The Triton path's attention functions and their autograd: the generic kernel attention (linear, efficient,
taylor, litemla), FLatten's focused attention and PolaFormer's polarity attention. Same math, arguments and
results as ``autograd.kernel.KernelAttention``, ``autograd.focus.FocusedAttention`` and
``functional_agent.pola_attention``. What is kept for backward: q, k, v, the extended context
([d + 1, dv + 1] per head), one fp32 per token (1/den), and the small per-channel statistics of the key
softmax. Feature maps, FLatten's focusing statistics and the output are recomputed, never saved.

Each runs as a torch operator (``ops.py``: ``torch.ops.segattn.*``) under ``torch.compile``, which keeps it
as one graph node, with the autograd formula below registered on it (``register_autograd``); in eager mode
(``run``) the same forward, formula and backward functions run through one autograd Function
(``Direct``), without the operator dispatch.

On a band of a split image (``segattn.parallel``) the context and, in backward, its gradient are summed over
the bands between the kernels' two phases (``ops.band_sum``; the split is captured when the forward runs
and entered again for the backward, which runs after it has ended), exactly where the PyTorch path sums
them.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import is_fake
from torch.autograd.function import once_differentiable

from ...parallel import active_split, token_count
from ...parallel.bands import Split, splitting
from . import ops
from .ops import MAP_KINDS, heads_view, inverse_scale

if TYPE_CHECKING:
    from ..functional import KernelCore

__all__ = [
    "focused_attention_triton",
    "heads_view",
    "kernel_attention_triton",
    "polarity_attention_triton",
]


def run(name: str, *inputs) -> tuple[Tensor, ...]:
    """Forward operator ``name`` on ``inputs``: the registered operator under ``torch.compile`` and on fake
    tensors (its fake implementation: ``bench traffic``), else its function (``ops.<name>``) through
    ``Direct``."""
    if torch.compiler.is_compiling() or is_fake(inputs[0]):
        return getattr(torch.ops.segattn, name).default(*inputs)
    return Direct.apply(name, *inputs)


class Direct(torch.autograd.Function):
    """An operator's function and autograd formula (``FORMULAS``) called directly, in eager mode; the
    formula's backward operators (``ctx.impl``) are the plain functions of ``ops`` too."""

    @staticmethod
    def forward(ctx, name: str, *inputs):
        ctx.set_materialize_grads(False)  # no zeros for the outputs kept for backward, which get no gradient
        output = getattr(ops, name)(*inputs)
        FORMULAS[name][0](ctx, inputs, output)
        ctx.name, ctx.impl = name, ops
        return output

    @staticmethod
    @once_differentiable
    def backward(ctx, grad, *_):
        ctx.needs_input_grad = ctx.needs_input_grad[1:]  # as the formula sees it: without ``name``
        if grad is None:  # the output had no gradient (only an unused saved output took part)
            return (None,) * (1 + len(ctx.needs_input_grad))
        return None, *FORMULAS[ctx.name][1](ctx, grad)


def on_split(split: Split | None) -> AbstractContextManager:
    """The split of an image the forward ran on, active again for its backward (which runs after the split
    has ended), so that the backward operator sums over the same bands."""
    return nullcontext() if split is None else splitting(split.group, split.band)


def kernel_attention_triton(
    q: Tensor, k: Tensor | None, v: Tensor | None, core: KernelCore, heads: int = 0
) -> Tensor:
    """The kernel-attention ``core`` (``functional.KernelCore``) on the Triton kernels. q, k, v: [B, h, N, d]
    views of any strides, or (``heads`` > 0) [B, N, C] tensors whose heads the kernels read through
    strides, in fp32/bf16/fp16 (CUDA, or the CPU under Triton's interpreter); computed in fp32 whatever
    autocast says; the result has v's shape, dtype and memory order. With k and v None, q is the [B, N, 3C]
    qkv whose column blocks are q, k, v (``heads`` > 0), and its gradient comes back as one tensor."""
    phi_q, phi_k = core.query_map, core.key_map
    maps = [MAP_KINDS.index(phi_q.name), MAP_KINDS.index(phi_k.name)]
    scalars = [phi_q.scale, phi_q.eps, phi_k.scale, phi_k.eps, 1.0, core.eps]
    tokens = token_count((q if k is None else k).shape[-2]) if core.mean else 1
    options = (core.normalize, core.taylor_term, heads)
    return run("kernel_attention", q, k, v, maps, scalars, tokens, *options)[0]


def kernel_setup(ctx, inputs: tuple, output: tuple) -> None:
    q, k, v, maps, scalars, tokens, _, taylor, heads = inputs
    _, kv, inv, columns = output
    ctx.mark_non_differentiable(kv, inv, columns)
    ctx.save_for_backward(q, k, v, kv, inv, columns)
    ctx.maps, ctx.scalars, ctx.tokens, ctx.taylor, ctx.heads = maps, scalars, tokens, taylor, heads
    ctx.split = active_split()
    ctx.impl = torch.ops.segattn


def kernel_backward(ctx, grad: Tensor, *_) -> tuple:
    q, k, v, *saved = ctx.saved_tensors
    with on_split(ctx.split):
        grads = ctx.impl.kernel_attention_backward(
            q, k, v, grad, saved, ctx.maps, ctx.scalars, ctx.tokens, ctx.taylor, ctx.heads
        )
    return *grads, *(None,) * (9 - len(grads))  # None for k, v beside a qkv (one gradient) and the options


def focused_attention_triton(
    q: Tensor, k: Tensor, v: Tensor, *, local: Tensor, scale: Tensor, power: float, eps: float, heads: int
) -> Tensor:
    """``autograd.focus.focused_attention_function`` on the Triton kernels: focusing statistics per token over
    all C channels (one small pass each for q and k), f_p and the kernel product per head in registers, the
    ``local`` (DWC) branch added in the same pass. q, k, v: [B, N, C] of any strides."""
    return run("focused_attention", q, k, v, local, scale, power, eps, heads)[0]


def focused_setup(ctx, inputs: tuple, output: tuple) -> None:
    q, k, v, _, scale, power, _, heads = inputs
    _, kv, inv = output
    ctx.mark_non_differentiable(kv, inv)
    ctx.save_for_backward(q, k, v, scale, kv, inv)
    ctx.power, ctx.heads, ctx.tokens, ctx.split = power, heads, token_count(k.shape[1]), active_split()
    ctx.impl = torch.ops.segattn


def focused_backward(ctx, grad: Tensor, *_) -> tuple:
    q, k, v, scale, *saved = ctx.saved_tensors
    with on_split(ctx.split):
        grad_q, grad_k, grad_v, grad_inv = ctx.impl.focused_attention_backward(
            q, k, v, grad, saved, scale, ctx.power, ctx.heads, ctx.tokens
        )
    # d(1/softplus(s))/ds = −sigmoid(s)·(1/softplus(s))²
    grad_scale = -grad_inv * inverse_scale(scale).square() * torch.sigmoid(scale.float())
    return grad_q, grad_k, grad_v, heads_view(grad, ctx.heads), grad_scale.to(scale.dtype), None, None, None


def polarity_attention_triton(q: Tensor, k: Tensor, v: Tensor, power: Tensor, eps: float) -> Tensor:
    """PolaFormer's token mixing (``functional_agent.pola_attention``) on the Triton kernels: q, k (already
    scaled) [B, h, N, d] and [B, h, M, d], v [B, h, M, d] with d even; ``power`` [h, d] (p > 0, learnable).
    Two kernel attentions over the 2d polarity features (computed in registers; 2d ≤ the kernels' head-dim
    limit), the same-sign one for v's first half of channels and the opposite-sign one (keys' halves
    swapped) for the second, each normalised by (its feature sum / M + eps); the kernels return ∂φ, folded
    onto q, k and the power after them."""
    return run("polarity_attention", q, k, v, power, eps)[0]


def polarity_setup(ctx, inputs: tuple, output: tuple) -> None:
    q, k, v, power, _ = inputs
    ctx.mark_non_differentiable(*output[1:])
    ctx.save_for_backward(q, k, v, power, *output[1:])
    ctx.impl = torch.ops.segattn


def polarity_backward(ctx, grad: Tensor, *_) -> tuple:
    q, k, v, power, *saved = ctx.saved_tensors
    needs_q, needs_k, _, needs_power, _ = ctx.needs_input_grad
    needs = [needs_q, needs_k, needs_power]
    grad_q, grad_k, grad_power, grad_v = ctx.impl.polarity_attention_backward(
        grad, q, k, v, power, saved, needs
    )
    return (
        grad_q if needs_q else None,
        grad_k if needs_k else None,
        grad_v,
        grad_power if needs_power else None,
        None,
    )


# forward operator -> (setup, backward): registered on the operators, and called by ``Direct``
FORMULAS: dict[str, tuple[Callable, Callable]] = {
    "kernel_attention": (kernel_setup, kernel_backward),
    "focused_attention": (focused_setup, focused_backward),
    "polarity_attention": (polarity_setup, polarity_backward),
}
for name, (setup, backward) in FORMULAS.items():
    torch.library.register_autograd(f"segattn::{name}", backward, setup_context=setup)
