"""Kernel attention as one autograd Function with a hand-written, memory-lean backward pass.

Same math as the plain formulas in ``functional.py`` / ``functional_approx.py`` (the reference, and the
path ``layers.choose_path`` picks while tracing, exporting or compiling, or with SEGATTN_FUSED=0),
arranged for fewer passes over memory:

- feature maps (``feature_maps``, ``random_features``) are written once, head-major and in the
  compute dtype (fp32, or float64 for float64 inputs), straight from the possibly strided / bf16 q, k
  views; nothing else is copied or upcast;
- kᵀv and the normaliser come from one context matrix [kᵀv | kᵀ1], so φ(q) meets the keys in a single
  batched matmul that yields numerator and denominator together;
- the output and the input gradients are written in the memory order of v and q (for the modules: heads
  merged, [B, N, C]), so no ``.contiguous()`` copy follows;
- backward saves q, k, v and the [d, d+1] contexts, not the output; cheap feature maps (relu, scaling,
  FLatten's focusing) are recomputed rather than saved.

Notation per head: A = φ(q), K = φ(k) [N, d]; S = c·KᵀV, z = c·Kᵀ1; O = (A S + β) / (A z + β₀ + eps).
FLatten's Function (``focus``) reuses ``context``, ``apply_context`` and ``kernel_backward``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ...parallel import token_count, token_reducer
from .buffers import compute_dtype, empty_in_order, heads_batch, zero_scalar
from .feature_maps import MapFunction


def context(keys: Tensor, v: Tensor, factor: float, normalized: bool) -> Tensor:
    """[c·Kᵀv | c·Kᵀ1] ([B, h, d, dv + 1]), or c·Kᵀv alone when there is no normaliser."""
    kv = torch.baddbmm(
        zero_scalar(keys, keys.dtype).expand(1, 1, 1),
        heads_batch(keys).mT,
        heads_batch(v),
        beta=0,
        alpha=factor,
    ).view(*keys.shape[:2], keys.shape[-1], v.shape[-1])
    if not normalized:
        return kv
    return torch.cat([kv, keys.sum(dim=-2).mul_(factor).unsqueeze(-1)], dim=-1)


def apply_context(
    phi_q: Tensor, ctx: Tensor, bias: Tensor | None, eps: float, out: Tensor, addend: Tensor | None = None
) -> Tensor | None:
    """out = (A S + β) / (A z + β₀ + eps) (+ addend), written into ``out``; returns 1/denominator
    ([B, h, N, 1]), or None without a normaliser (out = A S)."""
    batch, flat_ctx = heads_batch(phi_q), heads_batch(ctx)
    num = torch.bmm(batch, flat_ctx) if bias is None else torch.baddbmm(heads_batch(bias), batch, flat_ctx)
    num = num.view(*phi_q.shape[:-1], ctx.shape[-1])
    dv = out.shape[-1]
    if ctx.shape[-1] == dv:
        out.copy_(num)
        return None
    inv = num[..., dv:].add(eps).reciprocal_()
    if addend is None:
        torch.mul(num[..., :dv], inv, out=out)
    else:
        torch.addcmul(addend, num[..., :dv], inv, out=out)
    return inv


def kernel_backward(
    grad: Tensor,
    phi_q: Tensor,
    keys: Tensor,
    v: Tensor,
    ctx: Tensor,
    inv: Tensor | None,
    factor: float,
    bias: Tensor | None,
    reduce: Callable[[Tensor], Tensor] = lambda x: x,
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of A, K and v (compute dtype, [B, h, N, ·]) from the output gradient g.

    ``reduce`` sums the gradients of the token summaries ([∂S | ∂z], Taylor's ∂Σv) over the bands of a
    split image (``parallel.token_reducer``) before they reach this band's keys and values.

    With ĝ = g/den, P = ĝ Sᵀ and r = Σ_c ĝ_c out_c = (Σ_j A_j P_j + ĝ·β)/den: ∂A = P − r zᵀ,
    [∂S | ∂z] = Aᵀ[ĝ | −r], ∂K = c(v ∂Sᵀ + 1 ∂zᵀ), ∂v = c K ∂S (+ 1 Σ_n ĝ_n for Taylor's Σv term).
    The output itself is not needed, so it is not saved.
    """
    dtype, dv = phi_q.dtype, v.shape[-1]
    if inv is None:  # out = A S
        flat = heads_batch(grad.to(dtype))
        grad_q = torch.bmm(flat, heads_batch(ctx).mT).view(phi_q.shape)
        grad_kv = reduce(torch.bmm(heads_batch(phi_q).mT, flat))
        grad_k = torch.bmm(heads_batch(v), grad_kv.mT).view(keys.shape)
        grad_v = torch.bmm(heads_batch(keys), grad_kv).view(v.shape)
        if factor != 1:
            grad_k.mul_(factor), grad_v.mul_(factor)
        return grad_q, grad_k, grad_v
    scaled = torch.empty(*grad.shape[:-1], dv + 1, dtype=dtype, device=grad.device)  # [ĝ | −r]
    torch.mul(grad, inv, out=scaled[..., :dv])
    flat = heads_batch(scaled)
    right = heads_batch(ctx[..., :dv]).mT  # Sᵀ, [B·h, dv, d]
    if bias is not None:
        right = torch.cat([right, heads_batch(bias).mT[..., :dv, :]], dim=-1)  # [Sᵀ | β]
    d = phi_q.shape[-1]
    product = torch.bmm(flat[..., :dv], right)  # [B·h, N, d (+1)]
    grad_q = product[..., :d]
    r = torch.linalg.vecdot(grad_q, heads_batch(phi_q))
    if bias is not None:
        r += product[..., d]
    r = r.view(inv.shape[:-1]).mul_(inv.squeeze(-1))
    torch.neg(r, out=scaled[..., dv])
    grad_q = grad_q.addcmul_(flat[..., dv:], heads_batch(ctx[..., dv:]).mT)  # P − r zᵀ (flat holds −r)
    grad_ctx = reduce(torch.bmm(heads_batch(phi_q).mT, flat))  # [∂S | ∂z], [B·h, d, dv + 1]
    grad_kv = grad_ctx[..., :dv]
    grad_k = torch.baddbmm(grad_ctx[..., dv:].mT, heads_batch(v), grad_kv.mT, beta=factor, alpha=factor)
    v_bias = (
        reduce(flat[..., :dv].sum(dim=-2, keepdim=True))
        if bias is not None
        else zero_scalar(keys, dtype).expand(1, 1, 1)
    )
    grad_v = torch.baddbmm(v_bias, heads_batch(keys), grad_kv, alpha=factor)
    return grad_q.view(phi_q.shape), grad_k.view(keys.shape), grad_v.view(v.shape)


def taylor_bias(values: Tensor, tokens: int, reduce: Callable[[Tensor], Tensor]) -> Tensor:
    """β = [Σ_n v_n | N]: Taylor's constant 1 in sim(q, k) = 1 + q̂ᵀk̂, as a [B, h, 1, dv + 1] row; Σ_n
    over the whole image (``reduce``), N its token count."""
    return torch.cat(
        [reduce(values.sum(dim=-2, keepdim=True)), values.new_full((*values.shape[:2], 1, 1), tokens)], -1
    )


class KernelAttention(torch.autograd.Function):
    """O = (φq(q) S + β) / (φq(q) z + β₀ + eps) with [S | z] = c·φk(k)ᵀ[v | 1]; β = (Σv, N) for Taylor.
    On a band of a split image the sums over tokens ([S | z], Σv) and their gradients are summed over the
    bands (``parallel.token_reducer``); φk must then be per token.
    Called through ``kernel_attention_function``."""

    @staticmethod
    def forward(ctx, q, k, v, phi_q, phi_k, factor, eps, normalized, taylor):
        dtype = compute_dtype(q, k, v)
        with torch.autocast(q.device.type, enabled=False):
            a, keys = phi_q.forward(q, dtype), phi_k.forward(k, dtype)
            values = v.to(dtype)
            reduce = token_reducer()
            kv = reduce(context(keys, values, factor, normalized))
            bias = taylor_bias(values, token_count(k.shape[-2]), reduce) if taylor else None
            # one output row per query; keys/values may be fewer (PVT's spatial reduction)
            out = (
                empty_in_order(v, v.dtype)
                if v.shape[-2] == q.shape[-2]
                else v.new_empty(a.shape[:-1] + v.shape[-1:])
            )
            inv = apply_context(a, kv, bias, eps, out)
        ctx.maps, ctx.factor, ctx.reduce = (phi_q, phi_k), factor, reduce
        ctx.save_for_backward(
            q, k, v, kv, inv, bias, a if phi_q.saved else None, keys if phi_k.saved else None
        )
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        q, k, v, kv, inv, bias, a, keys = ctx.saved_tensors
        phi_q, phi_k = ctx.maps
        with torch.autocast(q.device.type, enabled=False):
            a = phi_q.forward(q, kv.dtype) if a is None else a
            keys = phi_k.forward(k, kv.dtype) if keys is None else keys
            grad_a, grad_keys, grad_v = kernel_backward(
                grad, a, keys, v.to(kv.dtype), kv, inv, ctx.factor, bias, ctx.reduce
            )
            grad_q, grad_k = empty_in_order(q, q.dtype), empty_in_order(k, k.dtype)
            phi_q.backward(q, a, grad_a, grad_q)
            phi_k.backward(k, keys, grad_keys, grad_k)
        return grad_q, grad_k, grad_v.to(v.dtype), None, None, None, None, None, None


def kernel_attention_function(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    phi_q: MapFunction,
    phi_k: MapFunction,
    context_scale: float = 1.0,
    eps: float = 0.0,
    normalize: bool = True,
    taylor_term: bool = False,
) -> Tensor:
    """Kernel attention in one autograd node: per head O = (φq(q) S + β) / (φq(q) z + β₀ + eps) with
    [S | z] = c·φk(k)ᵀ[v | 1] and c = ``context_scale``.

    q, k, v: [B, h, N, d] of any strides and float dtype; computed in fp32 (float64 stays float64) with
    autocast off; the result has v's shape, dtype and memory order. ``normalize=False`` drops the
    denominator, O = φq(q) S (Efficient Attention; ``eps`` unused). ``taylor_term`` adds Taylor's constant
    1 to every similarity: β = Σ_n v_n, β₀ = N (else β = β₀ = 0).
    """
    return KernelAttention.apply(q, k, v, phi_q, phi_k, context_scale, eps, normalize, taylor_term)
