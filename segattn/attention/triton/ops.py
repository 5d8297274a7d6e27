"""The Triton path as torch operators (``torch.library.custom_op``, namespace ``segattn``), so that
``torch.compile`` keeps calling the kernels: an operator is one opaque node of the compiled graph (its
``register_fake`` shapes let the compiler plan around it), where an autograd Function made it fall back
to the plain formula. The autograd formulas are registered in ``functions.py``, which in eager mode calls
the functions below directly instead (the dispatcher's Python path costs tens of µs per operator call).

Each attention is a forward operator that also returns what its backward reads (the extended contexts,
1/den per token, the key softmax's statistics: empty where there are none) and a backward operator, each
one launch of a two-phase kernel (a sum over all tokens, then its use). On a band of a split image the
generic kernel attention and FLatten's sum the context, and in backward its gradient, over the bands
between the two phases (``band_sum``: then two launches); their backward formula runs inside the
forward's split again. Operators take plain scalars: a feature map is its number (``MAP_KINDS``:
``FeatureMap.name``'s place), scale and eps; several scalars travel as one list (each operator argument
costs host time per call).

- ``kernel_attention(q, k, v, ...) -> (out, kv, inv, cols)``, ``kernel_attention_backward -> [∂q, ∂k, ∂v]``;
  given one [B, N, 3C] qkv as q, k and v None (``blocks``), they read its column blocks and the backward
  returns one ∂qkv, written block by block (autograd then concatenates no ∂q, ∂k, ∂v);
- ``focused_attention(q, k, v, local, scale, ...) -> (out, kv, inv)``, ``focused_attention_backward ->
  (∂q, ∂k, ∂v, ∂(1/softplus(scale)))``;
- ``polarity_attention(q, k, v, power, eps) -> (out, kv₁, inv₁, kv₂, inv₂)``, ``polarity_attention_backward
  -> (∂q, ∂k, ∂power, ∂v)`` (∂q, ∂k, ∂power empty where not needed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.library import custom_op, register_fake

from ...parallel import token_count, token_reducer, tokens_split
from ..autograd.buffers import empty_in_order
from ..autograd.polarity import polarity_backward
from .launch import MapSpec, as_heads, backward, focus_backward, focus_stats, forward, key_softmax_columns

# The feature maps by name, in the order of their numbers in the kernels (kernels.IDENTITY ... SOFTMAX_N)
MAP_KINDS = ("identity", "elu", "relu", "l2", "softmax_channels", "softmax_tokens")
KEY_SOFTMAX = MAP_KINDS.index("softmax_tokens")


OPERATORS: list[str] = []  # the names registered by ``operator``


def operator(fn: Callable) -> Callable:
    """Register ``fn`` as the operator ``segattn::<its name>`` and return it unchanged: in eager mode the
    Triton path calls it directly (``functions.run``), sparing the dispatcher's per-call cost."""
    custom_op(f"segattn::{fn.__name__}", fn, mutates_args=())
    OPERATORS.append(fn.__name__)
    return fn


def map_spec(kind: int, scale: float, eps: float, columns: Tensor | None = None) -> MapSpec:
    """The kernels' map number ``kind`` (``MAP_KINDS``) with its scalars; ``columns``: the key softmax's
    statistics."""
    spec = MapSpec(kind, scale=scale, eps=eps)
    if kind == KEY_SOFTMAX:
        d = columns.shape[-1]
        spec = replace(spec, cols=columns, col_strides=(2 * d, 0, d))
    return spec


def heads_view(x: Tensor, heads: int) -> Tensor:
    """[B, N, C] -> [B, h, N, d], a view."""
    return x.unflatten(-1, (heads, x.shape[-1] // heads)).transpose(1, 2)


def output_like(q: Tensor, v: Tensor) -> Tensor:
    """One output row per query in v's dtype and memory order; keys/values may be fewer (PVT's reduction)."""
    if v.shape[-2] == q.shape[-2]:
        return empty_in_order(v, v.dtype)
    return v.new_empty(q.shape[:-1] + v.shape[-1:])


def floats(like: Tensor, *shape) -> Tensor:
    return torch.empty(shape, dtype=torch.float32, device=like.device)


def band_sum() -> Callable[[Tensor], Tensor] | None:
    """The sum over the bands of a split image that runs between the kernels' two phases (then two
    launches); None outside a split (one launch)."""
    return token_reducer() if tokens_split() else None


def blocks(*tensors: Tensor | None) -> tuple[Tensor, ...]:
    """q, k, v: ``tensors`` without the Nones when three are given, else the column blocks of the one
    [B, N, 3C] qkv given."""
    given = [x for x in tensors if x is not None]
    return tuple(given) if len(given) == 3 else given[0].chunk(3, dim=-1)


@operator
def kernel_attention(
    q: Tensor,
    k: Tensor | None,
    v: Tensor | None,
    maps: list[int],
    scalars: list[float],
    tokens: int,
    normalize: bool,
    taylor: bool,
    heads: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """q, k, v: [B, h, N, d] (``heads`` 0), or [B, N, C] split into ``heads``, as the output is (or q their
    [B, N, 3C] qkv, k and v None: ``blocks``); ``maps``: φq's and φk's numbers (``MAP_KINDS``);
    ``scalars``: φq's scale and eps, φk's scale and eps, c and the normaliser's eps; the context is scaled
    by c / ``tokens`` (a token count passes as an integer: compiled code keeps it symbolic, where a float
    1/N would be specialised on, one graph per size)."""
    (query_map, key_map), (query_scale, query_eps, key_scale, key_eps, scale, eps) = maps, scalars
    q, k, v = blocks(q, k, v)
    columns = key_softmax_columns(k, heads) if key_map == KEY_SOFTMAX else floats(k, 0)
    specs = (map_spec(query_map, query_scale, query_eps), map_spec(key_map, key_scale, key_eps, columns))
    out = output_like(q, v)
    scalars, options = (scale / tokens, eps), (normalize, taylor)
    kv, inv = forward(q, k, v, out, specs, scalars, options, reduce=band_sum(), heads=heads)
    return out, kv, inv if inv is not None else floats(q, 0), columns


@register_fake("segattn::kernel_attention")
def _(q, k, v, maps, scalars, tokens, normalize, taylor, heads):
    q, k, v = blocks(q, k, v)
    (batch, heads, queries, d), (*_, dv) = as_heads(q, heads)[0], as_heads(v, heads)[0]
    inv = floats(q, batch * heads, queries) if normalize else floats(q, 0)
    columns = floats(k, batch * heads, 2, d) if maps[1] == KEY_SOFTMAX else floats(k, 0)
    return output_like(q, v), floats(k, batch * heads, d + 1, dv + 1), inv, columns


@operator
def kernel_attention_backward(
    q: Tensor,
    k: Tensor | None,
    v: Tensor | None,
    grad: Tensor,
    saved: list[Tensor],
    maps: list[int],
    scalars: list[float],
    tokens: int,
    taylor: bool,
    heads: int,
) -> list[Tensor]:
    """[∂q, ∂k, ∂v], or [∂qkv] for a qkv given alone (``blocks``); ``saved``: the forward's kv, 1/den
    ([B·h, N]; empty, 1-d, without a normaliser) and key softmax statistics; ``maps``, ``scalars``,
    ``tokens``, ``heads``: the forward's."""
    (query_map, key_map), (query_scale, query_eps, key_scale, key_eps, scale, _), (kv, inv, columns) = (
        maps, scalars, saved
    )  # fmt: skip
    specs = (map_spec(query_map, query_scale, query_eps), map_spec(key_map, key_scale, key_eps, columns))
    grads = [empty_in_order(x, x.dtype) for x in (q, k, v) if x is not None]
    inv, factor = inv if inv.dim() == 2 else None, scale / tokens
    backward(blocks(q, k, v), grad, (kv, inv), blocks(*grads), specs, factor, taylor, band_sum(), heads)
    return grads


@register_fake("segattn::kernel_attention_backward")
def _(q, k, v, grad, saved, maps, scalars, tokens, taylor, heads):
    return [empty_in_order(x, x.dtype) for x in (q, k, v) if x is not None]


def inverse_scale(scale: Tensor) -> Tensor:
    """1/softplus(scale), [C] fp32."""
    return F.softplus(scale.detach().float()).reciprocal_().contiguous()


def focus_map(x: Tensor, inv_scale: Tensor, power: float, heads: int) -> MapSpec:
    """FLatten's focusing map of x ([B, N, C]) with its per-token statistics computed."""
    from .kernels import FOCUS

    cols = (0, x.shape[-1] // heads, 0)  # channel c of head h is inv_scale[h·d + c]
    stats = focus_stats(x, inv_scale, power)
    return MapSpec(FOCUS, power=power, rows=stats, cols=inv_scale, col_strides=cols)


@operator
def focused_attention(
    q: Tensor, k: Tensor, v: Tensor, local: Tensor, scale: Tensor, power: float, eps: float, heads: int
) -> tuple[Tensor, Tensor, Tensor]:
    inv_scale = inverse_scale(scale)
    maps = tuple(focus_map(x, inv_scale, power, heads) for x in (q, k))
    factor = 1.0 / token_count(k.shape[1])  # the whole image's sums
    out = empty_in_order(v, v.dtype)
    kv, inv = forward(q, k, v, out, maps, (factor, eps), (True, False), local, band_sum(), heads)
    return out, kv, inv


@register_fake("segattn::focused_attention")
def _(q, k, v, local, scale, power, eps, heads):
    batch, tokens, d = q.shape[0], q.shape[1], q.shape[-1] // heads
    return (
        empty_in_order(v, v.dtype),
        floats(q, batch * heads, d + 1, d + 1),
        floats(q, batch * heads, tokens),
    )


@operator
def focused_attention_backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    grad: Tensor,
    saved: list[Tensor],
    scale: Tensor,
    power: float,
    heads: int,
    tokens: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(∂q, ∂k, ∂v, ∂(1/softplus(scale))); ``saved``: the forward's kv and 1/den; the context was divided by
    ``tokens``."""
    inv_scale = inverse_scale(scale)
    maps = tuple(focus_map(x, inv_scale, power, heads) for x in (q, k))
    # ∂L/∂f of the focused q and k: the focusing backward needs all heads of a token
    grad_fq, grad_fk, grad_v = floats(q, *q.shape), floats(k, *k.shape), empty_in_order(v, v.dtype)
    backward(
        (q, k, v),
        grad,
        tuple(saved),
        (grad_fq, grad_fk, grad_v),
        maps,
        1.0 / tokens,
        False,
        band_sum(),
        heads,
    )
    grad_q, grad_k = empty_in_order(q, q.dtype), empty_in_order(k, k.dtype)
    inv_from_q = focus_backward(q, grad_fq, inv_scale, maps[0].rows, power, grad_q)
    return (
        grad_q,
        grad_k,
        grad_v,
        inv_from_q + focus_backward(k, grad_fk, inv_scale, maps[1].rows, power, grad_k),
    )


@register_fake("segattn::focused_attention_backward")
def _(q, k, v, grad, saved, scale, power, heads, tokens):
    return (
        empty_in_order(q, q.dtype),
        empty_in_order(k, k.dtype),
        empty_in_order(v, v.dtype),
        floats(q, q.shape[-1]),
    )


def polarity_maps(power: Tensor) -> tuple[MapSpec, MapSpec, MapSpec]:
    """PolaFormer's maps for the kernels: queries [φ(q), φ(−q)], keys [φ(k), φ(−k)] for the same-sign half
    and [φ(−k), φ(k)] for the opposite-sign half; φ(x) = relu(x)^p with ``power`` p [h, d] fp32."""
    from .kernels import POLARITY, POLARITY_SWAPPED

    same = MapSpec(POLARITY, cols=power, col_strides=(0, power.shape[-1], 0), widening=2)
    return same, same, replace(same, kind=POLARITY_SWAPPED)


def halves(v: Tensor) -> tuple[slice, slice]:
    """v's first and second half of channels: the same-sign and the opposite-sign attention's."""
    half = v.shape[-1] // 2
    return slice(None, half), slice(half, None)


@operator
def polarity_attention(
    q: Tensor, k: Tensor, v: Tensor, power: Tensor, eps: float
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    query_map, *key_maps = polarity_maps(power.detach().float().contiguous())
    out, saved = output_like(q, v), []
    for key_map, part in zip(key_maps, halves(v), strict=True):
        scalars = (1.0 / k.shape[-2], eps)
        saved += forward(q, k, v[..., part], out[..., part], (query_map, key_map), scalars, (True, False))
    return out, *saved


@register_fake("segattn::polarity_attention")
def _(q, k, v, power, eps):
    (batch, heads, tokens, d), half = q.shape, v.shape[-1] // 2
    contexts = [floats(k, batch * heads, 2 * d + 1, width + 1) for width in (half, v.shape[-1] - half)]
    inv = [floats(q, batch * heads, tokens) for _ in contexts]
    return output_like(q, v), contexts[0], inv[0], contexts[1], inv[1]


@operator
def polarity_attention_backward(
    grad: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    power: Tensor,
    saved: list[Tensor],
    needs: list[bool],
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(∂q, ∂k, ∂power, ∂v); ``saved``: the forward's kv₁, inv₁, kv₂, inv₂; ``needs``: whether ∂q, ∂k,
    ∂power are wanted."""
    query_map, *key_maps = polarity_maps(power.detach().float().contiguous())
    grad_v = empty_in_order(v, v.dtype)
    grad_fq = grad_fk = None  # ∂φ(q), ∂φ(k) in [φ(x), φ(−x)] order, fp32, summed over the two halves
    for i, (key_map, part) in enumerate(zip(key_maps, halves(v), strict=True)):
        kv, inv = saved[2 * i], saved[2 * i + 1]
        grad_phi_q = floats(q, *q.shape[:-1], 2 * q.shape[-1])
        grad_phi_k = floats(k, *k.shape[:-1], 2 * k.shape[-1])
        backward(
            (q, k, v[..., part]),
            grad[..., part],
            (kv, inv),
            (grad_phi_q, grad_phi_k, grad_v[..., part]),
            (query_map, key_map),
            1.0 / k.shape[-2],
            False,
        )
        if grad_fq is None:
            grad_fq, grad_fk = grad_phi_q, grad_phi_k
        else:  # the opposite-sign half's keys were laid out [φ(−k), φ(k)]
            grad_fq += grad_phi_q
            grad_fk += grad_phi_k.roll(k.shape[-1], dims=-1)
    return (*fold_polarity(q, k, power, grad_fq, grad_fk, needs), grad_v)


def fold_polarity(
    q: Tensor, k: Tensor, power: Tensor, grad_fq: Tensor, grad_fk: Tensor, needs: list[bool]
) -> tuple[Tensor, Tensor, Tensor]:
    """∂q, ∂k and ∂power (each empty where not needed) from ∂[φ(x), φ(−x)] of q and k (fp32)."""
    p = power.float().unsqueeze(-2)  # [h, 1, d] against [B, h, N, d]
    needs_q, needs_k, needs_power = needs
    grad_q, power_from_q = polarity_backward(q.float(), p, grad_fq, needs_q, needs_power)
    grad_k, power_from_k = polarity_backward(k.float(), p, grad_fk, needs_k, needs_power)
    return (
        grad_q.to(q.dtype) if needs_q else q.new_empty(0),
        grad_k.to(k.dtype) if needs_k else k.new_empty(0),
        (power_from_q + power_from_k).squeeze(-2).to(power.dtype) if needs_power else power.new_empty(0),
    )


@register_fake("segattn::polarity_attention_backward")
def _(grad, q, k, v, power, saved, needs):
    grad_fq, grad_fk = (floats(x, *x.shape[:-1], 2 * x.shape[-1]) for x in (q, k))
    return (*fold_polarity(q, k, power, grad_fq, grad_fk, needs), empty_in_order(v, v.dtype))
