"""The Triton path's attention functions and their autograd: the generic kernel attention (linear, efficient,
taylor, litemla), FLatten's focused attention and PolaFormer's polarity attention. Same math, arguments and
results as ``fused.kernel.KernelAttention``, ``fused.focus.FocusedAttention`` and
``functional_agent.pola_attention``; each calls its forward operator (``ops.py``: ``torch.ops.segattn.*``,
which ``torch.compile`` keeps as one node) and registers the backward operators as its gradient. What is
kept for backward: q, k, v, the extended context ([d + 1, dv + 1] per head), one fp32 per token (1/den), and
the small per-channel statistics of the key softmax. Feature maps, FLatten's focusing statistics and the
output are recomputed, never saved.

On a band of a split image (``segattn.parallel``) the context and, in backward, its gradient are summed over
the bands between the kernels (``token_reducer``, captured when the forward runs: the backward runs after
the split has ended), exactly where the PyTorch path sums them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ...parallel import token_count, token_reducer
from . import ops
from .ops import heads_view, inverse_scale

__all__ = [
    "FeatureMap",
    "focused_attention_triton",
    "heads_view",
    "kernel_attention_triton",
    "polarity_attention_triton",
]


@dataclass(frozen=True)
class FeatureMap:
    """A feature map by name for ``kernel_attention_triton``: ``identity`` (φ = scale·x), ``elu`` (elu + 1),
    ``relu``, ``l2`` (x / max(‖x‖, eps)), ``softmax_channels`` (over the head's d channels) or
    ``softmax_tokens`` (over the N tokens; keys only, not on a split image)."""

    name: str
    scale: float = 1.0
    eps: float = 0.0


def kernel_attention_triton(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    phi_q: FeatureMap,
    phi_k: FeatureMap,
    context_scale: float = 1.0,
    eps: float = 0.0,
    normalize: bool = True,
    taylor_term: bool = False,
) -> Tensor:
    """``fused.kernel.kernel_attention_fused`` on the Triton kernels: per head
    O = (φq(q) S + β) / (φq(q) z + β₀ + eps) with [S | z] = c·φk(k)ᵀ[v | 1], c = ``context_scale``.

    q, k, v: [B, h, N, d] views of any strides in fp32/bf16/fp16 (CUDA, or the CPU under Triton's
    interpreter); computed in fp32 whatever autocast says; the result has v's shape, dtype and memory
    order. ``normalize=False``: O = φq(q) S. ``taylor_term``: β = Σ_n v_n, β₀ = N.
    """
    maps = (phi_q.name, phi_q.scale, phi_q.eps, phi_k.name, phi_k.scale, phi_k.eps)
    return ops.kernel_attention(q, k, v, *maps, context_scale, eps, normalize, taylor_term)[0]


def kernel_setup(ctx, inputs: tuple, output: tuple) -> None:
    q, k, v, *maps, factor, _, normalize, taylor = inputs
    _, kv, inv, columns = output
    ctx.mark_non_differentiable(kv, inv, columns)
    ctx.save_for_backward(q, k, v, kv, inv, columns)
    ctx.maps, ctx.options, ctx.reduce = maps, (factor, normalize, taylor), token_reducer()


def kernel_backward(ctx, grad: Tensor, *_) -> tuple:
    q, k, v, kv, inv, columns = ctx.saved_tensors
    factor, normalize, taylor = ctx.options
    query_map, key_map = ctx.maps[:3], ctx.maps[3:]
    grad_q, grad_kv = ops.kernel_attention_query_backward(q, grad, kv, inv, *query_map, normalize, taylor)
    grad_kv = ctx.reduce(grad_kv)
    grad_k, grad_v = ops.kernel_attention_keys_backward(k, v, kv, grad_kv, columns, *key_map, factor, taylor)
    return grad_q, grad_k, grad_v, *(None,) * 10


ops.kernel_attention.register_autograd(kernel_backward, setup_context=kernel_setup)


def focused_attention_triton(
    q: Tensor, k: Tensor, v: Tensor, *, local: Tensor, scale: Tensor, power: float, eps: float, heads: int
) -> Tensor:
    """``fused.focus.focused_attention_fused`` on the Triton kernels: focusing statistics per token over all
    C channels (one small pass each for q and k), f_p and the kernel product per head in registers, the
    ``local`` (DWC) branch added in the same pass. q, k, v: [B, N, C] of any strides."""
    return ops.focused_attention(q, k, v, local, scale, power, eps, heads)[0]


def focused_setup(ctx, inputs: tuple, output: tuple) -> None:
    q, k, v, _, scale, power, _, heads = inputs
    _, kv, inv = output
    ctx.mark_non_differentiable(kv, inv)
    ctx.save_for_backward(q, k, v, scale, kv, inv)
    ctx.power, ctx.heads, ctx.tokens, ctx.reduce = power, heads, token_count(k.shape[1]), token_reducer()


def focused_backward(ctx, grad: Tensor, *_) -> tuple:
    q, k, v, scale, kv, inv = ctx.saved_tensors
    power, heads = ctx.power, ctx.heads
    grad_q, grad_kv, grad_inv = ops.focused_attention_query_backward(q, grad, kv, inv, scale, power, heads)
    grad_kv = ctx.reduce(grad_kv)
    grad_k, grad_v, grad_inv_k = ops.focused_attention_keys_backward(
        k, v, grad_kv, scale, power, heads, ctx.tokens
    )
    # d(1/softplus(s))/ds = −sigmoid(s)·(1/softplus(s))²
    grad_scale = -(grad_inv + grad_inv_k) * inverse_scale(scale).square() * torch.sigmoid(scale.float())
    return grad_q, grad_k, grad_v, heads_view(grad, heads), grad_scale.to(scale.dtype), None, None, None


ops.focused_attention.register_autograd(focused_backward, setup_context=focused_setup)


def polarity_attention_triton(q: Tensor, k: Tensor, v: Tensor, power: Tensor, eps: float) -> Tensor:
    """PolaFormer's token mixing (``functional_agent.pola_attention``) on the Triton kernels: q, k (already
    scaled) [B, h, N, d] and [B, h, M, d], v [B, h, M, d] with d even; ``power`` [h, d] (p > 0, learnable).
    Two kernel attentions over the 2d polarity features (computed in registers; 2d ≤ the kernels' head-dim
    limit), the same-sign one for v's first half of channels and the opposite-sign one (keys' halves
    swapped) for the second, each normalised by (its feature sum / M + eps); the kernels return ∂φ, folded
    onto q, k and the power after them."""
    return ops.polarity_attention(q, k, v, power, eps)[0]


def polarity_setup(ctx, inputs: tuple, output: tuple) -> None:
    q, k, v, power, _ = inputs
    ctx.mark_non_differentiable(*output[1:])
    ctx.save_for_backward(q, k, v, power, *output[1:])


def polarity_backward(ctx, grad: Tensor, *_) -> tuple:
    q, k, v, power, *saved = ctx.saved_tensors
    needs_q, needs_k, _, needs_power, _ = ctx.needs_input_grad
    needs = [needs_q, needs_k, needs_power]
    grad_q, grad_k, grad_power, grad_v = ops.polarity_attention_backward(grad, q, k, v, power, saved, needs)
    return (
        grad_q if needs_q else None,
        grad_k if needs_k else None,
        grad_v,
        grad_power if needs_power else None,
        None,
    )


ops.polarity_attention.register_autograd(polarity_backward, setup_context=polarity_setup)
