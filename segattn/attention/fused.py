"""Fast paths of the linear kernels: autograd Functions with hand-written, memory-lean backward passes.

Same math as the plain functions in ``functional.py`` (which stay the reference and the path used while
tracing, exporting or compiling), arranged for fewer passes over memory:

- feature maps are written once, head-major and in the compute dtype (fp32, or float64 for float64
  inputs), straight from the possibly strided / bf16 q, k views; nothing else is copied or upcast;
- kᵀv and the normaliser come from one context matrix [kᵀv | kᵀ1], so φ(q) meets the keys in a single
  batched matmul that yields numerator and denominator together;
- the output and the input gradients are written in the memory order of v and q (for the modules: heads
  merged, [B, N, C]), so no ``.contiguous()`` copy follows;
- backward saves q, k, v and the [d, d+1] contexts, not the output; cheap feature maps (relu, scaling,
  FLatten's focusing) are recomputed rather than saved.

Notation per head: A = φ(q), K = φ(k) [N, d]; S = c·KᵀV, z = c·Kᵀ1; O = (A S + β) / (A z + β₀ + eps).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable


def use_fused() -> bool:
    """False while tracing, scripting, exporting or compiling: those see the plain reference ops."""
    return not (
        torch.jit.is_tracing()
        or torch.jit.is_scripting()
        or torch.onnx.is_in_onnx_export()
        or torch.compiler.is_compiling()
    )


def compute_dtype(*tensors: Tensor) -> torch.dtype:
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def empty_in_order(like: Tensor, dtype: torch.dtype) -> Tensor:
    """An empty tensor shaped like ``like`` whose memory follows ``like``'s stride order (e.g. a heads view
    of [B, N, C] gets [B, N, C] memory), so results land where the caller's next op reads them."""
    order = sorted(range(like.dim()), key=lambda i: -like.stride(i))
    buffer = torch.empty([like.shape[i] for i in order], dtype=dtype, device=like.device)
    return buffer.permute([order.index(i) for i in range(like.dim())])


def _zero(x: Tensor, dtype: torch.dtype) -> Tensor:
    # made per call, never cached: a cached scalar could carry a fake/meta tensor mode into real calls
    return torch.zeros((), dtype=dtype, device=x.device)


def _heads_batch(x: Tensor) -> Tensor:
    # [B, h, N, d] -> [B·h, N, d] (a view unless B > 1 and x is a strided heads view)
    return x.reshape(-1, *x.shape[-2:])


# --- feature maps: forward into a fresh head-major buffer; backward writes dx into ``out`` -------------


class FeatureMap:
    """φ applied per head on [B, h, N, d]; subclasses define the map and its vector-Jacobian product.

    ``saved``: keep φ(x) for backward (maps that cost several passes: exp, softmax, norms); otherwise it
    is recomputed from x (relu, scaling: one pass, and the memory stays free).
    """

    saved = True

    def forward(self, x: Tensor, dtype: torch.dtype) -> Tensor:
        raise NotImplementedError

    def backward(self, x: Tensor, phi: Tensor, grad: Tensor, out: Tensor) -> None:
        """Write ∂L/∂x into ``out`` given ``phi`` = φ(x) (left unchanged)."""
        raise NotImplementedError


class EluPlusOne(FeatureMap):
    """elu(x) + 1 = exp(min(x, 0)) + max(x, 0); two cheap passes instead of F.elu (≈4× an exp here)."""

    def forward(self, x: Tensor, dtype: torch.dtype) -> Tensor:
        phi = torch.empty(x.shape, dtype=dtype, device=x.device)
        torch.minimum(x, _zero(x, dtype), out=phi).exp_()
        return phi.add_(x.clamp(min=0))

    def backward(self, x: Tensor, phi: Tensor, grad: Tensor, out: Tensor) -> None:
        torch.mul(grad, phi.clamp(max=1), out=out)  # φ'(x) = exp(min(x, 0)) = min(φ(x), 1)


class Relu(FeatureMap):
    saved = False

    def forward(self, x: Tensor, dtype: torch.dtype) -> Tensor:
        return torch.maximum(x, _zero(x, dtype), out=torch.empty(x.shape, dtype=dtype, device=x.device))

    def backward(self, x: Tensor, phi: Tensor, grad: Tensor, out: Tensor) -> None:
        torch.ops.aten.threshold_backward.grad_input(grad, phi, 0, grad_input=out)  # grad where φ > 0


class Scale(FeatureMap):
    """φ(x) = c·x (c = 1: identity)."""

    saved = False

    def __init__(self, factor: float) -> None:
        self.factor = factor

    def forward(self, x: Tensor, dtype: torch.dtype) -> Tensor:
        return torch.mul(x, self.factor, out=torch.empty(x.shape, dtype=dtype, device=x.device))

    def backward(self, x: Tensor, phi: Tensor, grad: Tensor, out: Tensor) -> None:
        torch.mul(grad, self.factor, out=out)


class L2Normalize(FeatureMap):
    """x / max(‖x‖, eps) over the head's channels (F.normalize)."""

    def __init__(self, eps: float) -> None:
        self.eps = eps

    def forward(self, x: Tensor, dtype: torch.dtype) -> Tensor:
        # copy first: the norm of a contiguous head-major tensor is ~7x faster than over the strided view
        phi = torch.empty(x.shape, dtype=dtype, device=x.device).copy_(x)
        return phi.div_(torch.linalg.vector_norm(phi, dim=-1, keepdim=True).clamp_min_(self.eps))

    def backward(self, x: Tensor, phi: Tensor, grad: Tensor, out: Tensor) -> None:
        # d(x/‖x‖) = (g − x̂ (x̂·g)) / ‖x‖ where ‖x‖ > eps; g / eps where the eps floor is active.
        scratch = torch.empty_like(phi).copy_(x)
        norm = torch.linalg.vector_norm(scratch, dim=-1, keepdim=True)
        along = torch.linalg.vecdot(phi, grad).unsqueeze(-1).mul_(norm > self.eps)
        torch.addcmul(grad, phi, along, value=-1, out=scratch)
        torch.div(scratch, norm.clamp_min_(self.eps), out=out)


class Softmax(FeatureMap):
    """softmax over the head's channels (dim=-1) or over the tokens (dim=-2)."""

    def __init__(self, dim: int) -> None:
        self.dim = dim

    def forward(self, x: Tensor, dtype: torch.dtype) -> Tensor:
        return torch.softmax(x, dim=self.dim, dtype=dtype)

    def backward(self, x: Tensor, phi: Tensor, grad: Tensor, out: Tensor) -> None:
        if out.dtype == phi.dtype and out.is_contiguous():  # the out= kernel assumes a dense result
            torch._softmax_backward_data(grad, phi, self.dim, phi.dtype, grad_input=out)
        else:
            out.copy_(torch._softmax_backward_data(grad, phi, self.dim, phi.dtype))


class PositiveRandomFeatures(FeatureMap):
    """FAVOR+: φ(x) = m^-½ exp(s·ωᵀx − s²‖x‖²/2 − c) with s = d^-¼ and ω [m, d] a constant buffer; the
    stabiliser c (per query row, or over all keys of a head) is a constant for the gradient, since it
    cancels in the attention ratio. Backward: ∂x = s·(g⊙φ)ω − s²·x·Σ_m(g⊙φ)."""

    def __init__(self, projection: Tensor, scale: float, per_row: bool) -> None:
        self.projection, self.scale, self.per_row = projection, scale, per_row

    def forward(self, x: Tensor, dtype: torch.dtype) -> Tensor:
        x = x.to(dtype)
        logits = torch.matmul(x, self.projection.to(dtype).T.mul(self.scale))  # [B, h, N, m]
        logits.sub_(torch.linalg.vecdot(x, x).unsqueeze(-1).mul_(0.5 * self.scale**2))
        logits.sub_(logits.amax(dim=-1 if self.per_row else (-2, -1), keepdim=True))
        return logits.exp_().mul_(self.projection.shape[0] ** -0.5)

    def backward(self, x: Tensor, phi: Tensor, grad: Tensor, out: Tensor) -> None:
        weighted = grad.mul(phi)  # ∂L/∂logits
        grad_x = torch.matmul(weighted, self.projection.to(phi.dtype).mul(self.scale))
        norm_term = weighted.sum(dim=-1, keepdim=True).mul_(self.scale**2)
        out.copy_(grad_x.sub_(x.to(phi.dtype) * norm_term))


# --- the kernel product on features --------------------------------------------------------------------


def context(keys: Tensor, v: Tensor, factor: float, normalized: bool) -> Tensor:
    """[c·Kᵀv | c·Kᵀ1] ([B, h, d, dv + 1]), or c·Kᵀv alone when there is no normaliser."""
    kv = torch.baddbmm(
        _zero(keys, keys.dtype).expand(1, 1, 1), _heads_batch(keys).mT, _heads_batch(v), beta=0, alpha=factor
    ).view(*keys.shape[:2], keys.shape[-1], v.shape[-1])
    if not normalized:
        return kv
    return torch.cat([kv, keys.sum(dim=-2).mul_(factor).unsqueeze(-1)], dim=-1)


def apply_context(
    phi_q: Tensor, ctx: Tensor, bias: Tensor | None, eps: float, out: Tensor, addend: Tensor | None = None
) -> Tensor | None:
    """out = (A S + β) / (A z + β₀ + eps) (+ addend), written into ``out``; returns 1/denominator
    ([B, h, N, 1]), or None without a normaliser (out = A S)."""
    batch, flat_ctx = _heads_batch(phi_q), _heads_batch(ctx)
    num = torch.bmm(batch, flat_ctx) if bias is None else torch.baddbmm(_heads_batch(bias), batch, flat_ctx)
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
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of A, K and v (compute dtype, [B, h, N, ·]) from the output gradient g.

    With ĝ = g/den, P = ĝ Sᵀ and r = Σ_c ĝ_c out_c = (Σ_j A_j P_j + ĝ·β)/den: ∂A = P − r zᵀ,
    [∂S | ∂z] = Aᵀ[ĝ | −r], ∂K = c(v ∂Sᵀ + 1 ∂zᵀ), ∂v = c K ∂S (+ 1 Σ_n ĝ_n for Taylor's Σv term).
    The output itself is not needed, so it is not saved.
    """
    dtype, dv = phi_q.dtype, v.shape[-1]
    if inv is None:  # out = A S
        flat = _heads_batch(grad.to(dtype))
        grad_q = torch.bmm(flat, _heads_batch(ctx).mT).view(phi_q.shape)
        grad_kv = torch.bmm(_heads_batch(phi_q).mT, flat)
        grad_k = torch.bmm(_heads_batch(v), grad_kv.mT).view(keys.shape)
        grad_v = torch.bmm(_heads_batch(keys), grad_kv).view(v.shape)
        if factor != 1:
            grad_k.mul_(factor), grad_v.mul_(factor)
        return grad_q, grad_k, grad_v
    scaled = torch.empty(*grad.shape[:-1], dv + 1, dtype=dtype, device=grad.device)  # [ĝ | −r]
    torch.mul(grad, inv, out=scaled[..., :dv])
    flat = _heads_batch(scaled)
    right = _heads_batch(ctx[..., :dv]).mT  # Sᵀ, [B·h, dv, d]
    if bias is not None:
        right = torch.cat([right, _heads_batch(bias).mT[..., :dv, :]], dim=-1)  # [Sᵀ | β]
    d = phi_q.shape[-1]
    product = torch.bmm(flat[..., :dv], right)  # [B·h, N, d (+1)]
    grad_q = product[..., :d]
    r = torch.linalg.vecdot(grad_q, _heads_batch(phi_q))
    if bias is not None:
        r += product[..., d]
    r = r.view(inv.shape[:-1]).mul_(inv.squeeze(-1))
    torch.neg(r, out=scaled[..., dv])
    grad_q = grad_q.addcmul_(flat[..., dv:], _heads_batch(ctx[..., dv:]).mT)  # P − r zᵀ (flat holds −r)
    grad_ctx = torch.bmm(_heads_batch(phi_q).mT, flat)  # [∂S | ∂z], [B·h, d, dv + 1]
    grad_kv = grad_ctx[..., :dv]
    grad_k = torch.baddbmm(grad_ctx[..., dv:].mT, _heads_batch(v), grad_kv.mT, beta=factor, alpha=factor)
    v_bias = (
        flat[..., :dv].sum(dim=-2, keepdim=True) if bias is not None else _zero(keys, dtype).expand(1, 1, 1)
    )
    grad_v = torch.baddbmm(v_bias, _heads_batch(keys), grad_kv, alpha=factor)
    return grad_q.view(phi_q.shape), grad_k.view(keys.shape), grad_v.view(v.shape)


def taylor_bias(values: Tensor, tokens: int) -> Tensor:
    """β = [Σ_n v_n | N]: Taylor's constant 1 in sim(q, k) = 1 + q̂ᵀk̂, as a [B, h, 1, dv + 1] row."""
    return torch.cat(
        [values.sum(dim=-2, keepdim=True), values.new_full((*values.shape[:2], 1, 1), tokens)], -1
    )


class KernelAttention(torch.autograd.Function):
    """O = (φq(q) S + β) / (φq(q) z + β₀ + eps) with [S | z] = c·φk(k)ᵀ[v | 1]; β = (Σv, N) for Taylor."""

    @staticmethod
    def forward(ctx, q, k, v, phi_q, phi_k, factor, eps, normalized, taylor):
        dtype = compute_dtype(q, k, v)
        with torch.autocast(q.device.type, enabled=False):
            a, keys = phi_q.forward(q, dtype), phi_k.forward(k, dtype)
            values = v.to(dtype)
            kv = context(keys, values, factor, normalized)
            bias = taylor_bias(values, k.shape[-2]) if taylor else None
            out = empty_in_order(v, v.dtype)
            inv = apply_context(a, kv, bias, eps, out)
        ctx.maps, ctx.factor = (phi_q, phi_k), factor
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
                grad, a, keys, v.to(kv.dtype), kv, inv, ctx.factor, bias
            )
            grad_q, grad_k = empty_in_order(q, q.dtype), empty_in_order(k, k.dtype)
            phi_q.backward(q, a, grad_a, grad_q)
            phi_k.backward(k, keys, grad_keys, grad_k)
        return grad_q, grad_k, grad_v.to(v.dtype), None, None, None, None, None, None


# --- FLatten: focusing over all C channels + the kernel product + the DWC branch, one autograd node -------


def _heads_view(x: Tensor, heads: int) -> Tensor:
    # [B, N, C] -> [B, h, N, d] (a view, also of a strided qkv chunk)
    return x.unflatten(-1, (heads, x.shape[-1] // heads)).transpose(1, 2)


def _token_sum(x: Tensor) -> Tensor:
    # Σ over a token's C channels of a head-major [B, h, N, d] tensor -> [B, 1, N, 1]
    return x.sum(dim=-1, keepdim=True).sum(dim=1, keepdim=True)


def _raw_focus(x: Tensor, inv_scale: Tensor, heads: int, out: Tensor) -> Tensor:
    """u = (relu(x) + 1e-6)·(1/softplus(scale)) written head-major into ``out`` ([B, h, N, d])."""
    scale = inv_scale.view(heads, 1, -1)
    torch.maximum(_heads_view(x, heads), _zero(x, out.dtype), out=out)
    return torch.addcmul(scale * 1e-6, out, scale, out=out)


def focus_forward(x: Tensor, inv_scale: Tensor, power: float, heads: int, dtype: torch.dtype) -> Tensor:
    """f_p(u) = ‖u‖·(u/max u)^p / ‖(u/max u)^p‖ with u = (relu(x) + 1e-6)/softplus(scale), norms and max
    over all C channels of a token; x: [B, N, C]; returns f head-major, [B, h, N, d], in ``dtype``."""
    batch, tokens, channels = x.shape
    u = torch.empty(batch, heads, tokens, channels // heads, dtype=dtype, device=x.device)
    _raw_focus(x, inv_scale, heads, u)
    norm = _token_sum(u.square())
    u.div_(u.amax(dim=-1, keepdim=True).amax(dim=1, keepdim=True)).pow_(power)
    return u.mul_(norm.div_(_token_sum(u.square())).sqrt_())


def focus_backward(
    x: Tensor, inv_scale: Tensor, power: float, focused: Tensor, grad: Tensor, out: Tensor
) -> Tensor:
    """Write ∂L/∂x into ``out`` ([B, N, C]) from ∂L/∂f (head-major); return ∂L/∂(1/softplus(scale)), [C].

    With a² = ‖u‖² = ‖f‖² and γ = Σ_c g·f / a²: ∂L/∂u = p·(f/u)·(g − γ f) + γ u (the max cancels in f_p).
    """
    heads = focused.shape[1]
    u = _raw_focus(x, inv_scale, heads, torch.empty_like(focused))
    gamma = _token_sum(torch.linalg.vecdot(grad, focused).unsqueeze(-1)).div_(_token_sum(u.square()))
    grad_u = (
        torch.addcmul(grad, focused, gamma, value=-1).mul_(focused).div_(u).mul_(power).addcmul_(u, gamma)
    )
    grad_inv_scale = torch.linalg.vecdot(grad_u, u, dim=2).sum(dim=0).flatten().div_(inv_scale)
    grad_u.mul_(inv_scale.view(heads, 1, -1))
    torch.ops.aten.threshold_backward.grad_input(
        grad_u, _heads_view(x, heads), 0, grad_input=_heads_view(out, heads)
    )
    return grad_inv_scale


class FocusedAttention(torch.autograd.Function):
    """FLatten's token mixing: f_p-focused q, k (all C channels), then per head
    O = A (KᵀV/N) / (A mean(K) + eps) + local, with ``local`` the DWC branch ([B, h, N, d]).
    q, k, v: [B, N, C]; the output follows v's memory order."""

    @staticmethod
    def forward(ctx, q, k, v, local, scale, power, eps, heads):
        dtype = compute_dtype(q, k, v, scale)
        with torch.autocast(q.device.type, enabled=False):
            inv_scale = torch.nn.functional.softplus(scale.to(dtype)).reciprocal_()
            a = focus_forward(q, inv_scale, power, heads, dtype)
            keys = focus_forward(k, inv_scale, power, heads, dtype)
            values = _heads_view(v, heads).to(dtype)
            kv = context(keys, values, 1.0 / k.shape[1], normalized=True)
            out = empty_in_order(v, v.dtype)
            inv = apply_context(a, kv, None, eps, _heads_view(out, heads), addend=local)
        ctx.power, ctx.heads = power, heads
        ctx.save_for_backward(q, k, v, scale, kv, inv)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        q, k, v, scale, kv, inv = ctx.saved_tensors
        power, heads, dtype = ctx.power, ctx.heads, kv.dtype
        grad_heads = _heads_view(grad, heads)
        with torch.autocast(q.device.type, enabled=False):
            inv_scale = torch.nn.functional.softplus(scale.to(dtype)).reciprocal_()
            a = focus_forward(q, inv_scale, power, heads, dtype)
            keys = focus_forward(k, inv_scale, power, heads, dtype)
            values = _heads_view(v, heads).to(dtype)
            grad_a, grad_keys, grad_v = kernel_backward(
                grad_heads, a, keys, values, kv, inv, 1.0 / k.shape[1], None
            )
            grad_q, grad_k = empty_in_order(q, q.dtype), empty_in_order(k, k.dtype)
            grad_inv = focus_backward(q, inv_scale, power, a, grad_a, grad_q)
            grad_inv += focus_backward(k, inv_scale, power, keys, grad_keys, grad_k)
            # d(1/softplus(s))/ds = −sigmoid(s)·(1/softplus(s))²
            grad_scale = grad_inv.mul_(inv_scale.square()).mul_(torch.sigmoid(scale.to(dtype))).neg_()
        grad_v = grad_v.transpose(1, 2).reshape(v.shape).to(v.dtype)
        return grad_q, grad_k, grad_v, grad_heads, grad_scale.to(scale.dtype), None, None, None


# --- depthwise "same" convolution (FLatten's DWC, Mix-FFN) with a backward made of forward convolutions ----
