"""Autograd Functions of the Triton path: the generic kernel attention (linear, efficient, taylor, litemla),
FLatten's focused attention and PolaFormer's polarity attention. Same math, arguments and results as
``fused.kernel.KernelAttention``, ``fused.focus.FocusedAttention`` and ``functional_agent.pola_attention``;
what differs is what is kept for backward: q, k, v, the extended context
([d + 1, dv + 1] per head), one fp32 per token (1/den), and the small per-channel statistics of the key
softmax. Feature maps, FLatten's focusing statistics and the output are recomputed, never saved.

On a band of a split image (``segattn.parallel``) the context and, in backward, its gradient are summed over
the bands between the kernels (``token_reducer``), exactly where the PyTorch path sums them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from ...parallel import token_count, token_reducer
from ..fused.buffers import empty_in_order
from ..fused.polarity import polarity_backward
from .launch import (
    MapSpec,
    apply,
    context,
    focus_backward,
    focus_stats,
    key_softmax_columns,
    keys_backward,
    query_backward,
)


@dataclass(frozen=True)
class FeatureMap:
    """A feature map by name for ``kernel_attention_triton``: ``identity`` (φ = scale·x), ``elu`` (elu + 1),
    ``relu``, ``l2`` (x / max(‖x‖, eps)), ``softmax_channels`` (over the head's d channels) or
    ``softmax_tokens`` (over the N tokens; keys only, not on a split image)."""

    name: str
    scale: float = 1.0
    eps: float = 0.0

    def spec(self) -> MapSpec:
        from .kernels import ELU, IDENTITY, L2, RELU, SOFTMAX_D, SOFTMAX_N

        kinds = {"identity": IDENTITY, "elu": ELU, "relu": RELU, "l2": L2}
        kinds |= {"softmax_channels": SOFTMAX_D, "softmax_tokens": SOFTMAX_N}
        return MapSpec(kinds[self.name], scale=self.scale, eps=self.eps)


def heads_view(x: Tensor, heads: int) -> Tensor:
    """[B, N, C] -> [B, h, N, d], a view."""
    return x.unflatten(-1, (heads, x.shape[-1] // heads)).transpose(1, 2)


class TritonKernelAttention(torch.autograd.Function):
    """O = (φq(q) S + β) / (φq(q) z + β₀ + eps) with [S | z] = c·φk(k)ᵀ[v | 1], β = (Σv, N) for Taylor;
    q, k, v: [B, h, N, d] views. Called through ``kernel_attention_triton``."""

    @staticmethod
    def forward(ctx, q, k, v, phi_q, phi_k, factor, eps, normalized, taylor):
        query_map, key_map = phi_q.spec(), phi_k.spec()
        if phi_k.name == "softmax_tokens":
            d = k.shape[-1]
            key_map = replace(key_map, cols=key_softmax_columns(k), col_strides=(3 * d, 0, d))
        reduce = token_reducer()
        kv = reduce(context(k, v, key_map, factor))
        # one output row per query; keys/values may be fewer (PVT's spatial reduction)
        out = (
            empty_in_order(v, v.dtype)
            if v.shape[-2] == q.shape[-2]
            else v.new_empty(q.shape[:-1] + v.shape[-1:])
        )
        inv = apply(q, kv, out, query_map, eps, normalized, taylor)
        ctx.maps, ctx.factor, ctx.taylor, ctx.reduce = (query_map, key_map), factor, taylor, reduce
        ctx.save_for_backward(q, k, v, kv, inv, key_map.cols)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        q, k, v, kv, inv, columns = ctx.saved_tensors
        query_map, key_map = ctx.maps
        grad_q, grad_k, grad_v = (empty_in_order(t, t.dtype) for t in (q, k, v))
        grad_kv = ctx.reduce(query_backward(q, grad, kv, inv, grad_q, query_map, ctx.taylor))
        if columns is not None:  # the key softmax's Σ_n φ·∂φ per channel is Σ_j ∂S·S: its statistics' row 2
            d, dv = k.shape[-1], v.shape[-1]
            columns = columns.clone()
            columns[:, 2] = (grad_kv[:, :d, :dv] * kv[:, :d, :dv]).sum(dim=-1)
            key_map = replace(key_map, cols=columns)
        keys_backward(k, v, grad_kv, grad_k, grad_v, key_map, ctx.factor, ctx.taylor)
        return grad_q, grad_k, grad_v, None, None, None, None, None, None


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
    return TritonKernelAttention.apply(q, k, v, phi_q, phi_k, context_scale, eps, normalize, taylor_term)


def focus_maps(
    q: Tensor, k: Tensor, scale: Tensor, power: float, heads: int
) -> tuple[MapSpec, MapSpec, Tensor]:
    """FLatten's focusing maps of q and k ([B, N, C]; their per-token statistics computed) and
    1/softplus(scale), [C] fp32."""
    from .kernels import FOCUS

    inv_scale = F.softplus(scale.detach().float()).reciprocal_().contiguous()
    cols = (0, q.shape[-1] // heads, 0)  # channel c of head h is inv_scale[h·d + c]
    query_map, key_map = (
        MapSpec(FOCUS, power=power, rows=focus_stats(x, inv_scale, power), cols=inv_scale, col_strides=cols)
        for x in (q, k)
    )
    return query_map, key_map, inv_scale


class TritonFocusedAttention(torch.autograd.Function):
    """FLatten's token mixing on the Triton kernels; arguments and result as ``fused.focus.FocusedAttention``.
    Called through ``focused_attention_triton``."""

    @staticmethod
    def forward(ctx, q, k, v, local, scale, power, eps, heads):
        query_map, key_map, _ = focus_maps(q, k, scale, power, heads)
        reduce, factor = token_reducer(), 1.0 / token_count(k.shape[1])  # the whole image's sums
        kv = reduce(context(heads_view(k, heads), heads_view(v, heads), key_map, factor))
        out = empty_in_order(v, v.dtype)
        inv = apply(heads_view(q, heads), kv, heads_view(out, heads), query_map, eps, True, False, local)
        ctx.power, ctx.heads, ctx.factor, ctx.reduce = power, heads, factor, reduce
        ctx.save_for_backward(q, k, v, scale, kv, inv)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        q, k, v, scale, kv, inv = ctx.saved_tensors
        power, heads = ctx.power, ctx.heads
        query_map, key_map, inv_scale = focus_maps(q, k, scale, power, heads)
        # ∂L/∂f of the focused q and k, [B, N, C] fp32: the focusing backward needs all heads of a token
        grad_fq, grad_fk = (torch.empty(t.shape, dtype=torch.float32, device=t.device) for t in (q, k))
        grad_heads = heads_view(grad, heads)
        grad_kv = query_backward(
            heads_view(q, heads), grad_heads, kv, inv, heads_view(grad_fq, heads), query_map, False
        )
        grad_kv = ctx.reduce(grad_kv)
        grad_v = empty_in_order(v, v.dtype)
        keys_backward(
            heads_view(k, heads),
            heads_view(v, heads),
            grad_kv,
            heads_view(grad_fk, heads),
            heads_view(grad_v, heads),
            key_map,
            ctx.factor,
            False,
        )
        grad_q, grad_k = empty_in_order(q, q.dtype), empty_in_order(k, k.dtype)
        grad_inv = focus_backward(q, grad_fq, inv_scale, query_map.rows, power, grad_q)
        grad_inv += focus_backward(k, grad_fk, inv_scale, key_map.rows, power, grad_k)
        # d(1/softplus(s))/ds = −sigmoid(s)·(1/softplus(s))²
        grad_scale = grad_inv.mul_(inv_scale.square()).mul_(torch.sigmoid(scale.float())).neg_()
        return grad_q, grad_k, grad_v, grad_heads, grad_scale.to(scale.dtype), None, None, None


def focused_attention_triton(
    q: Tensor, k: Tensor, v: Tensor, *, local: Tensor, scale: Tensor, power: float, eps: float, heads: int
) -> Tensor:
    """``fused.focus.focused_attention_fused`` on the Triton kernels: focusing statistics per token over all
    C channels (one small pass each for q and k), f_p and the kernel product per head in registers, the
    ``local`` (DWC) branch added in the same pass. q, k, v: [B, N, C] of any strides."""
    return TritonFocusedAttention.apply(q, k, v, local, scale, power, eps, heads)


def polarity_maps(power: Tensor) -> tuple[MapSpec, MapSpec, MapSpec]:
    """PolaFormer's maps for the kernels: queries [φ(q), φ(−q)], keys [φ(k), φ(−k)] for the same-sign half
    and [φ(−k), φ(k)] for the opposite-sign half; φ(x) = relu(x)^p with ``power`` p [h, d] fp32."""
    from .kernels import POLARITY, POLARITY_SWAPPED

    same = MapSpec(POLARITY, cols=power, col_strides=(0, power.shape[-1], 0), widening=2)
    return same, same, replace(same, kind=POLARITY_SWAPPED)


class TritonPolarityAttention(torch.autograd.Function):
    """``functional_agent.pola_attention`` on the Triton kernels: two kernel attentions over the 2d polarity
    features, the same-sign one for v's first half of channels and the opposite-sign one (keys' halves
    swapped) for the second, each normalised by (its feature sum / M + eps). Keeps q, k, v, the power, two
    contexts and two floats per token; the kernels return ∂φ, folded onto q, k and the power here."""

    @staticmethod
    def forward(ctx, q, k, v, power, eps):
        half, factor = v.shape[-1] // 2, 1.0 / k.shape[-2]
        query_map, *key_maps = polarity_maps(power.detach().float().contiguous())
        out = (
            empty_in_order(v, v.dtype)
            if v.shape[-2] == q.shape[-2]
            else v.new_empty(q.shape[:-1] + v.shape[-1:])
        )
        saved = []
        for key_map, part in zip(key_maps, (slice(None, half), slice(half, None)), strict=True):
            kv = context(k, v[..., part], key_map, factor)
            saved += [kv, apply(q, kv, out[..., part], query_map, eps, True, False)]
        ctx.factor = factor
        ctx.save_for_backward(q, k, v, power, *saved)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        q, k, v, power, *saved = ctx.saved_tensors
        half = v.shape[-1] // 2
        query_map, *key_maps = polarity_maps(power.detach().float().contiguous())
        grad_v = empty_in_order(v, v.dtype)
        grad_fq = grad_fk = None  # ∂φ(q), ∂φ(k) in [φ(x), φ(−x)] order, fp32, summed over the two halves
        parts = (slice(None, half), slice(half, None))
        for i, (key_map, part) in enumerate(zip(key_maps, parts, strict=True)):
            kv, inv = saved[2 * i], saved[2 * i + 1]
            grad_phi_q = q.new_empty(*q.shape[:-1], 2 * q.shape[-1], dtype=torch.float32)
            grad_kv = query_backward(q, grad[..., part], kv, inv, grad_phi_q, query_map, False)
            grad_phi_k = k.new_empty(*k.shape[:-1], 2 * k.shape[-1], dtype=torch.float32)
            keys_backward(k, v[..., part], grad_kv, grad_phi_k, grad_v[..., part], key_map, ctx.factor, False)
            if grad_fq is None:
                grad_fq, grad_fk = grad_phi_q, grad_phi_k
            else:  # the opposite-sign half's keys were laid out [φ(−k), φ(k)]
                grad_fq += grad_phi_q
                grad_fk += grad_phi_k.roll(k.shape[-1], dims=-1)
        p = power.float().unsqueeze(-2)  # [h, 1, d] against [B, h, N, d]
        needs_q, needs_k, _, needs_power, _ = ctx.needs_input_grad
        grad_q, power_from_q = polarity_backward(q.float(), p, grad_fq, needs_q, needs_power)
        grad_k, power_from_k = polarity_backward(k.float(), p, grad_fk, needs_k, needs_power)
        grad_power = (power_from_q + power_from_k).squeeze(-2).to(power.dtype) if needs_power else None
        return (
            grad_q.to(q.dtype) if needs_q else None,
            grad_k.to(k.dtype) if needs_k else None,
            grad_v,
            grad_power,
            None,
        )


def polarity_attention_triton(q: Tensor, k: Tensor, v: Tensor, power: Tensor, eps: float) -> Tensor:
    """PolaFormer's token mixing (``functional_agent.pola_attention``) on the Triton kernels: q, k (already
    scaled) [B, h, N, d] and [B, h, M, d], v [B, h, M, d] with d even; ``power`` [h, d] (p > 0, learnable).
    The feature maps are computed in registers (2d wide; 2d ≤ the kernels' head-dim limit)."""
    return TritonPolarityAttention.apply(q, k, v, power, eps)
