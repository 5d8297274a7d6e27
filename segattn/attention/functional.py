"""Pure attention math: every function maps q, k, v of shape [B, heads, N, d] to [B, heads, N, d].

The linear variants never build an N×N tensor: they contract keys with values first ([d, d] per head)
and then apply the queries. Feature maps, the kᵀv product and the normaliser run in fp32 even under
bf16/fp16 autocast (float64 inputs stay float64); the result comes back in the dtype of ``v``.
Only matmul, reshape and elementwise ops are used so that ONNX and TorchScript tracing work.

Each linear function has two fast paths taken in eager mode, chosen by ``backend`` (an attention module
passes the ``kernel_backend`` it read when built; None reads the environment now): the Triton kernels
(``triton/``: CUDA tensors by default; torch operators, so ``torch.compile`` keeps them) and the PyTorch
Functions (``fused/kernel.py``: an autograd Function that writes fewer intermediates and recomputes feature
maps in backward). While tracing, exporting or (short of the Triton path) compiling, and for a ``"plain"``
backend (SEGATTN_FUSED=0; ``fused_switch.use_fused``), the plain code below runs instead, so exporters and
compilers see ordinary ops.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..layers import kernel_backend, use_fused
from ..parallel import token_count, token_softmax, token_sum, tokens_split
from .fused.feature_maps import EluPlusOne, L2Normalize, Relu, Scale, Softmax
from .fused.kernel import kernel_attention_fused
from .triton import use_triton
from .triton.functions import FeatureMap, kernel_attention_triton

__all__ = [
    "efficient_attention",
    "focused_feature_map",
    "focused_linear_attention",
    "linear_attention",
    "softmax_attention",
    "taylor_attention",
]

EFFICIENT_NORMALIZATIONS = ("softmax", "scale")
LINEAR_FEATURE_MAPS = ("elu", "relu")


def _upcast(x: Tensor) -> Tensor:
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def triton_path(backend: str | None, q: Tensor) -> bool:
    """Whether this call takes the Triton kernels: ``backend`` (None: SEGATTN_KERNEL now) for q's device,
    dtype and head dim (``triton.use_triton``)."""
    return use_triton(kernel_backend() if backend is None else backend, q, q.shape[-1])


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
    key_softmax = normalization == "softmax"
    if key_softmax and tokens_split():  # the key softmax runs over all tokens
        return _efficient_attention(q, k, v, normalization)
    if triton_path(backend, q):  # scale: (q/√N)(k/√N)ᵀv as the context divided by N
        maps = ("softmax_channels", "softmax_tokens") if key_softmax else ("identity",) * 2
        phi_q, phi_k = (FeatureMap(name) for name in maps)
        return kernel_attention_triton(
            q, k, v, phi_q=phi_q, phi_k=phi_k, mean=not key_softmax, normalize=False
        )
    if not use_fused(backend):
        return _efficient_attention(q, k, v, normalization)
    if normalization == "softmax":
        phi_q, phi_k = Softmax(-1), Softmax(-2)
    else:
        phi_q = phi_k = Scale(token_count(k.shape[-2]) ** -0.5)
    return kernel_attention_fused(q, k, v, phi_q=phi_q, phi_k=phi_k, normalize=False)


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
    q: Tensor, k: Tensor, v: Tensor, feature_map: str = "elu", eps: float = 1e-6, backend: str | None = None
) -> Tensor:
    """Linear attention (Katharopoulos et al. 2020) with φ = elu(x) + 1 (or relu); q, k before φ."""
    if feature_map not in LINEAR_FEATURE_MAPS:
        raise ValueError(
            f"linear_attention: feature_map={feature_map!r}; expected one of {LINEAR_FEATURE_MAPS}"
        )
    if triton_path(backend, q):
        kernel_map = FeatureMap(feature_map)
        return kernel_attention_triton(q, k, v, phi_q=kernel_map, phi_k=kernel_map, eps=eps)
    if not use_fused(backend):
        return _linear_attention(q, k, v, feature_map, eps)
    phi = EluPlusOne() if feature_map == "elu" else Relu()
    return kernel_attention_fused(q, k, v, phi_q=phi, phi_k=phi, eps=eps)


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
    if triton_path(backend, q):
        kernel_map = FeatureMap("l2", eps=eps)
        return kernel_attention_triton(q, k, v, phi_q=kernel_map, phi_k=kernel_map, eps=eps, taylor_term=True)
    if not use_fused(backend):
        return _taylor_attention(q, k, v, eps)
    phi = L2Normalize(eps)
    return kernel_attention_fused(q, k, v, phi_q=phi, phi_k=phi, eps=eps, taylor_term=True)


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
    if triton_path(backend, q):
        kernel_map = FeatureMap("identity")
        return kernel_attention_triton(q, k, v, phi_q=kernel_map, phi_k=kernel_map, mean=True, eps=eps)
    if not use_fused(backend):
        return _focused_linear_attention(q, k, v, eps)
    factor = 1.0 / token_count(k.shape[-2])
    identity = Scale(1.0)
    return kernel_attention_fused(q, k, v, phi_q=identity, phi_k=identity, context_scale=factor, eps=eps)


@full_precision
def _focused_linear_attention(q: Tensor, k: Tensor, v: Tensor, eps: float) -> Tensor:
    n = token_count(k.shape[-2])
    context = token_sum((k.transpose(-2, -1) * n**-0.5) @ (v * n**-0.5))  # [B, h, d, d]
    normalizer = q @ (token_sum(k.sum(dim=-2, keepdim=True)) / n).transpose(-2, -1)  # [B, h, N, 1]
    return (q @ context) / (normalizer + eps)
