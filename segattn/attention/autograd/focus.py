"""FLatten's token mixing as one autograd Function: focusing over all C channels, the kernel product
(``kernel``) and the depthwise-conv branch's sum, with a hand-written backward that recomputes the
focused maps instead of saving them.

The plain formula it optimises is ``FocusedLinearAttention.focus`` + ``functional.focused_linear_attention``
(where ``layers.choose_path`` picks PLAIN: while tracing, exporting or compiling, or with SEGATTN_FUSED=0).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ...parallel import token_count, token_reducer
from .buffers import compute_dtype, empty_in_order, zero_scalar
from .kernel import apply_context, context, kernel_backward


def heads_view(x: Tensor, heads: int) -> Tensor:
    """[B, N, C] -> [B, h, N, d], a view (also of a strided qkv chunk)."""
    return x.unflatten(-1, (heads, x.shape[-1] // heads)).transpose(1, 2)


def token_sum(x: Tensor) -> Tensor:
    """Σ over a token's C channels of a head-major [B, h, N, d] tensor -> [B, 1, N, 1]."""
    return x.sum(dim=-1, keepdim=True).sum(dim=1, keepdim=True)


def raw_focus(x: Tensor, inv_scale: Tensor, heads: int, out: Tensor) -> Tensor:
    """u = (relu(x) + 1e-6)·(1/softplus(scale)) written head-major into ``out`` ([B, h, N, d])."""
    scale = inv_scale.view(heads, 1, -1)
    torch.maximum(heads_view(x, heads), zero_scalar(x, out.dtype), out=out)
    return torch.addcmul(scale * 1e-6, out, scale, out=out)


def focus_forward(x: Tensor, inv_scale: Tensor, power: float, heads: int, dtype: torch.dtype) -> Tensor:
    """f_p(u) = ‖u‖·(u/max u)^p / ‖(u/max u)^p‖ with u = (relu(x) + 1e-6)/softplus(scale), norms and max
    over all C channels of a token; x: [B, N, C]; returns f head-major, [B, h, N, d], in ``dtype``."""
    batch, tokens, channels = x.shape
    u = torch.empty(batch, heads, tokens, channels // heads, dtype=dtype, device=x.device)
    raw_focus(x, inv_scale, heads, u)
    norm = token_sum(u.square())
    u.div_(u.amax(dim=-1, keepdim=True).amax(dim=1, keepdim=True)).pow_(power)
    return u.mul_(norm.div_(token_sum(u.square())).sqrt_())


def focus_backward(
    x: Tensor, inv_scale: Tensor, power: float, focused: Tensor, grad: Tensor, out: Tensor
) -> Tensor:
    """Write ∂L/∂x into ``out`` ([B, N, C]) from ∂L/∂f (head-major); return ∂L/∂(1/softplus(scale)), [C].

    With a² = ‖u‖² = ‖f‖² and γ = Σ_c g·f / a²: ∂L/∂u = p·(f/u)·(g − γ f) + γ u (the max cancels in f_p).
    """
    heads = focused.shape[1]
    u = raw_focus(x, inv_scale, heads, torch.empty_like(focused))
    gamma = token_sum(torch.linalg.vecdot(grad, focused).unsqueeze(-1)).div_(token_sum(u.square()))
    grad_u = (
        torch.addcmul(grad, focused, gamma, value=-1).mul_(focused).div_(u).mul_(power).addcmul_(u, gamma)
    )
    grad_inv_scale = torch.linalg.vecdot(grad_u, u, dim=2).sum(dim=0).flatten().div_(inv_scale)
    grad_u.mul_(inv_scale.view(heads, 1, -1))
    torch.ops.aten.threshold_backward.grad_input(
        grad_u, heads_view(x, heads), 0, grad_input=heads_view(out, heads)
    )
    return grad_inv_scale


class FocusedAttention(torch.autograd.Function):
    """FLatten's token mixing: f_p-focused q, k (all C channels), then per head
    O = A (KᵀV/N) / (A mean(K) + eps) + local, with ``local`` the DWC branch ([B, h, N, d]).
    q, k, v: [B, N, C]; the output follows v's memory order. Called through ``focused_attention_function``."""

    @staticmethod
    def forward(ctx, q, k, v, local, scale, power, eps, heads):
        dtype = compute_dtype(q, k, v, scale)
        with torch.autocast(q.device.type, enabled=False):
            inv_scale = torch.nn.functional.softplus(scale.to(dtype)).reciprocal_()
            a = focus_forward(q, inv_scale, power, heads, dtype)
            keys = focus_forward(k, inv_scale, power, heads, dtype)
            values = heads_view(v, heads).to(dtype)
            reduce, factor = token_reducer(), 1.0 / token_count(k.shape[1])  # the whole image's sums
            kv = reduce(context(keys, values, factor, normalized=True))
            out = empty_in_order(v, v.dtype)
            inv = apply_context(a, kv, None, eps, heads_view(out, heads), addend=local)
        ctx.power, ctx.heads, ctx.factor, ctx.reduce = power, heads, factor, reduce
        ctx.save_for_backward(q, k, v, scale, kv, inv)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        q, k, v, scale, kv, inv = ctx.saved_tensors
        power, heads, dtype = ctx.power, ctx.heads, kv.dtype
        grad_heads = heads_view(grad, heads)
        with torch.autocast(q.device.type, enabled=False):
            inv_scale = torch.nn.functional.softplus(scale.to(dtype)).reciprocal_()
            a = focus_forward(q, inv_scale, power, heads, dtype)
            keys = focus_forward(k, inv_scale, power, heads, dtype)
            values = heads_view(v, heads).to(dtype)
            grad_a, grad_keys, grad_v = kernel_backward(
                grad_heads, a, keys, values, kv, inv, ctx.factor, None, ctx.reduce
            )
            grad_q, grad_k = empty_in_order(q, q.dtype), empty_in_order(k, k.dtype)
            grad_inv = focus_backward(q, inv_scale, power, a, grad_a, grad_q)
            grad_inv += focus_backward(k, inv_scale, power, keys, grad_keys, grad_k)
            # d(1/softplus(s))/ds = −sigmoid(s)·(1/softplus(s))²
            grad_scale = grad_inv.mul_(inv_scale.square()).mul_(torch.sigmoid(scale.to(dtype))).neg_()
        grad_v = grad_v.transpose(1, 2).reshape(v.shape).to(v.dtype)
        return grad_q, grad_k, grad_v, grad_heads, grad_scale.to(scale.dtype), None, None, None


def focused_attention_function(
    q: Tensor, k: Tensor, v: Tensor, *, local: Tensor, scale: Tensor, power: float, eps: float, heads: int
) -> Tensor:
    """FLatten's token mixing in one autograd node: q, k ← f_p((relu(·) + 1e-6)/softplus(``scale``)) over
    all C channels (f_p: norm-preserving power ``power``), then per head
    O = φ(q) (φ(k)ᵀv/N) / (φ(q) mean(φ(k)) + eps) + ``local``.

    q, k, v: [B, N, C] (any strides); ``local``: the DWC branch, [B, h, N, d]; ``scale``: the [C] parameter,
    which gets its gradient. Computed in fp32 (float64 stays float64) with autocast off; the result is
    [B, N, C] in v's dtype and memory order, heads merged.
    """
    return FocusedAttention.apply(q, k, v, local, scale, power, eps, heads)
