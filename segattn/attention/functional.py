"""Pure attention math: every function maps q, k, v of shape [B, heads, N, d] to [B, heads, N, d].

The linear variants never build an N×N tensor: they contract keys with values first ([d, d] per head)
and then apply the queries. Feature maps, the kᵀv product and the normaliser run in fp32 even under
bf16/fp16 autocast (float64 inputs stay float64); the result comes back in the dtype of ``v``.
Only matmul, reshape and elementwise ops are used so that ONNX and TorchScript tracing work.

Each linear function declares its kernel-attention core (``KernelCore``: feature maps, normaliser, mean
and Taylor terms) and its plain formula; ``run_kernel_core`` runs the core on the path that
``layers.choose_path`` picks for the call under ``backend`` (an attention module passes the
``kernel_backend`` it read when built; None reads the environment now): the Triton kernels (``triton/``:
CUDA tensors by default; torch operators, so ``torch.compile`` keeps them), the PyTorch Function
(``autograd/kernel.py``: an autograd Function that writes fewer intermediates and recomputes feature maps in
backward) or the plain formula below, which is what exporters and compilers see.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..layers import PLAIN, TRITON, choose_path
from ..parallel import token_count, token_softmax, token_sum
from .autograd.feature_maps import EluPlusOne, L2Normalize, MapFunction, Relu, Scale, Softmax
from .autograd.kernel import kernel_attention_function
from .triton.functions import kernel_attention_triton

__all__ = [
    "FeatureMap",
    "KernelCore",
    "efficient_attention",
    "focused_feature_map",
    "focused_linear_attention",
    "linear_attention",
    "run_kernel_core",
    "softmax_attention",
    "taylor_attention",
]

EFFICIENT_NORMALIZATIONS = ("softmax", "scale")
LINEAR_FEATURE_MAPS = ("elu", "relu")


def _upcast(x: Tensor) -> Tensor:
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


@dataclass(frozen=True)
class FeatureMap:
    """A feature map φ of a kernel-attention core, by name: ``identity`` (φ = scale·x), ``elu`` (elu + 1),
    ``relu``, ``l2`` (x / max(‖x‖, eps)), ``softmax_channels`` (over the head's d channels) or
    ``softmax_tokens`` (over the N tokens; keys only)."""

    name: str
    scale: float = 1.0
    eps: float = 0.0

    def function_map(self) -> MapFunction:
        """This map with its hand-written backward, for the PyTorch Function (``autograd.feature_maps``)."""
        if self.name in ("identity", "l2"):
            return Scale(self.scale) if self.name == "identity" else L2Normalize(self.eps)
        if self.name.startswith("softmax"):
            return Softmax(-1 if self.name == "softmax_channels" else -2)
        return EluPlusOne() if self.name == "elu" else Relu()


@dataclass(frozen=True)
class KernelCore:
    """What a kernel-attention core computes, per head: O = (φq(q) S + β) / (φq(q) z + β₀ + eps) with
    [S | z] = c·φk(k)ᵀ[v | 1]; c = 1/N for ``mean`` (N: the whole image's tokens), else 1.
    ``normalize=False``: O = φq(q) S. ``taylor_term``: Taylor's constant 1 in every similarity, β = Σ_n v_n
    and β₀ = N (else 0). ``function``: whether it has a PyTorch Function form (LiteMLA's has none)."""

    query_map: FeatureMap
    key_map: FeatureMap
    mean: bool = False
    eps: float = 0.0
    normalize: bool = True
    taylor_term: bool = False
    function: bool = True


def run_kernel_core(
    core: KernelCore,
    q: Tensor,
    k: Tensor | None,
    v: Tensor | None,
    backend: str | None,
    plain: Callable[[Tensor, Tensor, Tensor], Tensor],
    heads: int = 0,
) -> Tensor:
    """``core`` on q, k, v ([B, h, N, d]) on the path ``layers.choose_path`` picks under ``backend``: the
    Triton kernels, the PyTorch Function (``autograd.kernel``) or ``plain(q, k, v)``, the variant's plain
    formula. ``heads`` > 0: q, k, v and the result are [B, N, C] tensors of that many heads, which the
    Triton kernels read through strides and the other paths split and merge; or q is the [B, N, 3C] qkv
    whose column blocks they are, k and v None (the Triton kernels then write one ∂qkv: no concatenation
    in backward). A key softmax runs over all tokens: on a band of a split image only the plain formula
    takes it."""
    whole_image = core.key_map.name == "softmax_tokens"
    channels = q.shape[-1] // 3 if k is None else q.shape[-1]
    head_dim = channels // heads if heads else channels
    path = choose_path(backend, q, triton_head_dim=head_dim, function=core.function, whole_image=whole_image)
    if path == TRITON:
        return kernel_attention_triton(q, k, v, core, heads)
    if k is None:
        q, k, v = q.chunk(3, dim=-1)
    if heads:
        split = (x.unflatten(-1, (heads, head_dim)).transpose(1, 2) for x in (q, k, v))
        return torch_core(path, core, *split, plain).transpose(1, 2).flatten(2)
    return torch_core(path, core, q, k, v, plain)


def torch_core(
    path: str,
    core: KernelCore,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    plain: Callable[[Tensor, Tensor, Tensor], Tensor],
) -> Tensor:
    """``run_kernel_core``'s PLAIN and FUNCTION paths on [B, h, N, d] tensors."""
    if path == PLAIN:
        return plain(q, k, v)
    options = {"eps": core.eps, "normalize": core.normalize, "taylor_term": core.taylor_term}
    phi_q, phi_k, factor = core.query_map.function_map(), core.key_map.function_map(), 1.0
    if core.mean and core.normalize:
        factor = 1.0 / token_count(k.shape[-2])
    elif core.mean:  # identity maps: (q/√N)(k/√N)ᵀv, as Efficient Attention's plain formula computes it
        phi_q = phi_k = Scale(token_count(k.shape[-2]) ** -0.5)
    return kernel_attention_function(q, k, v, phi_q=phi_q, phi_k=phi_k, context_scale=factor, **options)


def full_precision(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """Run ``fn(q, k, v, ...)`` with autocast off and half inputs upcast; return in ``v``'s dtype."""

    @functools.wraps(fn)
    def wrapper(q: Tensor, k: Tensor, v: Tensor, *args, **kwargs) -> Tensor:
        device_type = q.device.type
        if torch.is_autocast_enabled(device_type):
            with torch.autocast(device_type=device_type, enabled=False):
                out = fn(_upcast(q), _upcast(k), _upcast(v), *args, **kwargs)
        else:
            out = fn(_upcast(q), _upcast(k), _upcast(v), *args, **kwargs)
        return out.to(v.dtype)

    return wrapper


def softmax_attention(q: Tensor, k: Tensor, v: Tensor, dropout_p: float = 0.0) -> Tensor:
    """softmax(q kᵀ / √d) v through PyTorch SDPA: the quadratic baseline (fused kernels where available)."""
    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)


def efficient_attention(
    q: Tensor, k: Tensor, v: Tensor, normalization: str = "softmax", backend: str | None = None
) -> Tensor:
    """Efficient Attention (Shen et al. 2018): ρq(q) · (ρk(k)ᵀ v).

    ``softmax``: ρq = softmax of each query over its d channels, ρk = softmax of each key channel over
    the N positions (no 1/√d). ``scale``: ρq = q/√N, ρk = k/√N, which equals (q kᵀ / N) v exactly.
    """
    if normalization not in EFFICIENT_NORMALIZATIONS:
        raise ValueError(
            f"efficient_attention: normalization={normalization!r}; "
            f"expected one of {EFFICIENT_NORMALIZATIONS}"
        )
    if normalization == "softmax":
        core = KernelCore(FeatureMap("softmax_channels"), FeatureMap("softmax_tokens"), normalize=False)
    else:  # (q/√N)(k/√N)ᵀv: the context divided by N
        core = KernelCore(FeatureMap("identity"), FeatureMap("identity"), mean=True, normalize=False)
    return run_kernel_core(
        core, q, k, v, backend, functools.partial(_efficient_attention, normalization=normalization)
    )


@full_precision
def _efficient_attention(q: Tensor, k: Tensor, v: Tensor, normalization: str) -> Tensor:
    if normalization == "softmax":
        q, k = q.softmax(dim=-1), token_softmax(k, dim=-2)
    else:
        n = token_count(k.shape[-2])
        q, k = q * n**-0.5, k * n**-0.5
    context = token_sum(k.transpose(-2, -1) @ v)  # [B, h, d, d]
    return q @ context


def kernel_attention(phi_q: Tensor, phi_k: Tensor, v: Tensor, eps: float) -> Tensor:
    """out_i = φq_iᵀ (Σ_j φk_j v_jᵀ) / (φq_iᵀ Σ_j φk_j + eps), for non-negative features φq, φk."""
    context = token_sum(phi_k.transpose(-2, -1) @ v)  # [B, h, d, d]
    normalizer = phi_q @ token_sum(phi_k.sum(dim=-2, keepdim=True)).transpose(-2, -1)  # [B, h, N, 1]
    return (phi_q @ context) / (normalizer + eps)


def linear_attention(
    q: Tensor,
    k: Tensor | None,
    v: Tensor | None,
    feature_map: str = "elu",
    eps: float = 1e-6,
    backend: str | None = None,
    heads: int = 0,
) -> Tensor:
    """Linear attention (Katharopoulos et al. 2020) with φ = elu(x) + 1 (or relu); q, k before φ; [B, N, C]
    tensors of ``heads`` heads where that is > 0, or q their [B, N, 3C] qkv, k and v None
    (``run_kernel_core``)."""
    if feature_map not in LINEAR_FEATURE_MAPS:
        raise ValueError(
            f"linear_attention: feature_map={feature_map!r}; expected one of {LINEAR_FEATURE_MAPS}"
        )
    core = KernelCore(FeatureMap(feature_map), FeatureMap(feature_map), eps=eps)
    plain = functools.partial(_linear_attention, feature_map=feature_map, eps=eps)
    return run_kernel_core(core, q, k, v, backend, plain, heads)


@full_precision
def _linear_attention(q: Tensor, k: Tensor, v: Tensor, feature_map: str, eps: float) -> Tensor:
    if feature_map == "elu":
        phi_q, phi_k = F.elu(q) + 1.0, F.elu(k) + 1.0
    else:
        phi_q, phi_k = F.relu(q), F.relu(k)
    return kernel_attention(phi_q, phi_k, v, eps)


def taylor_attention(
    q: Tensor, k: Tensor, v: Tensor, eps: float = 1e-6, backend: str | None = None
) -> Tensor:
    """Taylor linear attention (Li et al. 2020): sim(q, k) = 1 + q̂ᵀk̂ with q̂, k̂ L2-normalised per head.

    out_i = (Σ_j v_j + q̂_iᵀ Σ_j k̂_j v_jᵀ) / (N + q̂_iᵀ Σ_j k̂_j + eps); q̂ = q / max(‖q‖, eps).
    """
    core = KernelCore(FeatureMap("l2", eps=eps), FeatureMap("l2", eps=eps), eps=eps, taylor_term=True)
    return run_kernel_core(core, q, k, v, backend, functools.partial(_taylor_attention, eps=eps))


@full_precision
def _taylor_attention(q: Tensor, k: Tensor, v: Tensor, eps: float) -> Tensor:
    n = token_count(k.shape[-2])
    q_hat, k_hat = F.normalize(q, dim=-1, eps=eps), F.normalize(k, dim=-1, eps=eps)
    numerator = token_sum(v.sum(dim=-2, keepdim=True)) + q_hat @ token_sum(k_hat.transpose(-2, -1) @ v)
    denominator = n + q_hat @ token_sum(k_hat.sum(dim=-2, keepdim=True)).transpose(-2, -1) + eps
    return numerator / denominator


def focused_feature_map(x: Tensor, p: float = 3.0) -> Tensor:
    """FLatten's focusing function f_p(x) = ‖x‖ · x^p / ‖x^p‖ over the last (channel) dim of [B, N, C].

    Expects x > 0 (FLatten applies relu + 1e-6 first); keeps each token's norm and sharpens its direction.
    The power is taken of x / max(x), which leaves f_p unchanged but keeps ‖x^p‖ ≥ 1: no 0/0 for tiny
    tokens (all channels ≤ 0 before relu) and no overflow for large x or p. fp32 under autocast; returns
    the input dtype.
    """
    dtype = x.dtype
    x = _upcast(x)
    x_pow = (x / x.amax(dim=-1, keepdim=True)) ** p
    out = x_pow * (x.norm(dim=-1, keepdim=True) / x_pow.norm(dim=-1, keepdim=True))
    return out.to(dtype)


def focused_linear_attention(
    q: Tensor, k: Tensor, v: Tensor, eps: float = 1e-6, backend: str | None = None
) -> Tensor:
    """FLatten's kernel product with φ = identity: out_i = q_iᵀ(kᵀv / N) / (q_iᵀ mean_j k_j + eps).

    kᵀv is formed as (kᵀ/√N)(v/√N) and the normaliser from the mean of k: the published guard against
    overflow at large N. q, k must already be non-negative (focused features).
    """
    core = KernelCore(FeatureMap("identity"), FeatureMap("identity"), mean=True, eps=eps)
    return run_kernel_core(core, q, k, v, backend, functools.partial(_focused_linear_attention, eps=eps))


@full_precision
def _focused_linear_attention(q: Tensor, k: Tensor, v: Tensor, eps: float) -> Tensor:
    n = token_count(k.shape[-2])
    context = token_sum((k.transpose(-2, -1) * n**-0.5) @ (v * n**-0.5))  # [B, h, d, d]
    normalizer = q @ (token_sum(k.sum(dim=-2, keepdim=True)) / n).transpose(-2, -1)  # [B, h, N, 1]
    return (q @ context) / (normalizer + eps)
