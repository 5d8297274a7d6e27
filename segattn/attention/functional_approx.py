"""Pure math of the softmax approximations: Performer (FAVOR+), Linformer and Nyströmformer.

Same conventions as ``functional.py``: q, k, v are [B, heads, N, d], results are [B, heads, N, d], no N×N
tensor is ever built, and the approximations run in fp32 under bf16/fp16 autocast (output in ``v``'s dtype).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..layers import PLAIN, choose_path
from ..parallel import token_max
from .autograd.kernel import kernel_attention_function
from .autograd.random_features import PositiveRandomFeatures
from .functional import full_precision, kernel_attention, softmax_attention

__all__ = [
    "iterative_pinv",
    "linformer_attention",
    "nystrom_attention",
    "orthogonal_random_features",
    "performer_attention",
    "positive_random_features",
    "segment_means",
]


def orthogonal_random_features(
    num_features: int, dim: int, generator: torch.Generator | None = None, dtype: torch.dtype = torch.float32
) -> Tensor:
    """[num_features, dim] projection ω for FAVOR+: rows orthogonal within blocks of ``dim``, each row
    rescaled by an independent χ(dim) norm so that every row is marginally N(0, I) (drawn on the CPU)."""
    num_blocks = -(-num_features // dim)
    gaussian = torch.randn(num_blocks, dim, dim, generator=generator, dtype=dtype, device="cpu")
    q, r = torch.linalg.qr(gaussian)
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)  # Haar-distributed blocks
    rows = q.transpose(-2, -1).reshape(num_blocks * dim, dim)[:num_features]
    norms = torch.randn(num_features, dim, generator=generator, dtype=dtype, device="cpu").norm(
        dim=-1, keepdim=True
    )
    return rows * norms


def positive_random_features(x: Tensor, projection: Tensor, is_query: bool) -> Tensor:
    """φ(x) = m^-½ exp(ωᵀx − ‖x‖²/2 − c) for x already scaled by d^-¼; [B, h, N, d] -> [B, h, N, m].

    The stabiliser c is the largest exponent of each query row (``is_query``) or of all keys of a head:
    both cancel in the attention ratio, and they keep the largest feature at m^-½ so exp cannot overflow.
    """
    logits = x @ projection.transpose(-2, -1) - 0.5 * x.square().sum(dim=-1, keepdim=True)  # [B, h, N, m]
    if is_query:
        stabiliser = logits.amax(dim=-1, keepdim=True).detach()
    else:  # over the whole image's keys when it is split into bands
        stabiliser = token_max(logits.amax(dim=(-2, -1), keepdim=True).detach())
    return torch.exp(logits - stabiliser) * projection.shape[0] ** -0.5


def performer_attention(
    q: Tensor, k: Tensor, v: Tensor, projection: Tensor, eps: float = 1e-6, backend: str | None = None
) -> Tensor:
    """FAVOR+ (Choromanski et al. 2020): kernel attention with positive random features of the softmax
    kernel, an unbiased estimate of softmax(q kᵀ/√d) v; ``projection`` is ω [m, d] (a constant); the
    PyTorch Function where ``layers.choose_path`` says so under ``backend`` (the module's
    ``kernel_backend``)."""
    if choose_path(backend, q, whole_image=True) == PLAIN:  # whole: the keys' stabiliser is a max over all
        return _performer_attention(q, k, v, projection, eps)
    scale = q.shape[-1] ** -0.25
    phi_q = PositiveRandomFeatures(projection, scale, per_row=True)
    phi_k = PositiveRandomFeatures(projection, scale, per_row=False)
    return kernel_attention_function(q, k, v, phi_q=phi_q, phi_k=phi_k, eps=eps)


@full_precision
def _performer_attention(q: Tensor, k: Tensor, v: Tensor, projection: Tensor, eps: float) -> Tensor:
    scale = q.shape[-1] ** -0.25
    projection = projection.to(q.dtype)
    phi_q = positive_random_features(q * scale, projection, is_query=True)
    phi_k = positive_random_features(k * scale, projection, is_query=False)
    return kernel_attention(phi_q, phi_k, v, eps)


@full_precision
def linformer_attention(q: Tensor, k: Tensor, v: Tensor, e: Tensor, f: Tensor) -> Tensor:
    """Linformer (Wang et al. 2020): softmax(q (E k)ᵀ/√d)(F v) with E, F: [rows, ≥N] over the sequence.

    Only the first N columns of E and F are used, as they are (no rescaling), so fewer tokens reuse the
    leading part of the learned projections. E k and F v sum over the tokens, so all of it runs in fp32.
    """
    n = k.shape[-2]
    if e.shape[-1] < n or f.shape[-1] < n:
        raise ValueError(
            f"linformer_attention: E {list(e.shape)} / F {list(f.shape)} cover fewer than the N={n} tokens"
        )
    e, f = e[:, :n].to(k.dtype), f[:, :n].to(k.dtype)
    return softmax_attention(q, e @ k, f @ v)  # keys/values: [B, h, rows, d]


def segment_means(x: Tensor, num_segments: int) -> Tensor:
    """Means of ``num_segments`` consecutive token segments: [B, h, N, d] -> [B, h, num_segments, d]."""
    return segment_averaging(x, num_segments) @ x


def segment_averaging(x: Tensor, num_segments: int) -> Tensor:
    """The [s, N] matrix that averages the s token segments of ``x`` [..., N, d] (``segment_means``).

    N is padded up to s·⌈N/s⌉ with one pad token at the end of each of the last s·⌈N/s⌉ − N segments and
    only real tokens are averaged, so segments hold ⌈N/s⌉ or ⌈N/s⌉ − 1 tokens and none is empty. With
    N < s the surplus segments repeat the last token (repeated landmarks leave the Nyström product unchanged
    under an exact pseudo-inverse). Written as an [s, N] averaging matrix with s fixed and no reshape by
    N-dependent sizes, so exported graphs keep N dynamic.
    """
    n = x.shape[-2]
    length = (n + num_segments - 1) // num_segments
    first_short = n - num_segments * (length - 1)  # segments from here on hold one pad token
    index = torch.arange(num_segments, device=x.device)
    start = (index * length - (index - first_short).clamp(min=0)).clamp(max=n - 1)
    stop = torch.maximum(start + length - (index >= first_short).long(), start + 1)
    tokens = torch.arange(n, device=x.device)
    member = (tokens >= start[:, None]) & (tokens < stop[:, None])  # [s, N]
    return member.to(x.dtype) / (stop - start).to(x.dtype)[:, None]


def iterative_pinv(a: Tensor, iterations: int = 6) -> Tensor:
    """Moore–Penrose pseudo-inverse of square matrices [..., m, m] by the Newton–Schulz-type iteration
    Nyströmformer uses: Z ← ¼ Z (13I − AZ(15I − AZ(7I − AZ))), Z₀ = Aᵀ / (‖A‖₁ ‖A‖∞) per matrix."""
    abs_a = a.abs()
    norm_1 = abs_a.sum(dim=-2).amax(dim=-1)  # max column sum
    norm_inf = abs_a.sum(dim=-1).amax(dim=-1)  # max row sum
    z = a.transpose(-2, -1) / (norm_1 * norm_inf)[..., None, None]
    identity = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    for _ in range(iterations):
        az = a @ z
        z = 0.25 * z @ (13 * identity - az @ (15 * identity - az @ (7 * identity - az)))
    return z


@full_precision
def nystrom_attention(
    q: Tensor, k: Tensor, v: Tensor, num_landmarks: int = 64, pinv_iterations: int = 6
) -> Tensor:
    """Nyströmformer (Xiong et al. 2021): softmax(q k̃ᵀ/√d) · pinv(softmax(q̃ k̃ᵀ/√d)) · softmax(q̃ kᵀ/√d) v,
    with landmarks q̃, k̃ the segment means of q, k (see ``segment_averaging``)."""
    scale = q.shape[-1] ** -0.5
    averaging = segment_averaging(q, num_landmarks)  # q and k share N: one matrix for both
    q_land, k_land = averaging @ q, averaging @ k  # [B, h, m, d]
    # 1/√d goes on the m landmarks, not on the [N, m] scores: one pass fewer over them, forward and backward.
    q_land_scaled, k_land_scaled = q_land * scale, k_land * scale
    kernel_q = (q @ k_land_scaled.transpose(-2, -1)).softmax(dim=-1)  # [B, h, N, m]
    kernel_land = (q_land @ k_land_scaled.transpose(-2, -1)).softmax(dim=-1)  # [B, h, m, m]
    kernel_k = (q_land_scaled @ k.transpose(-2, -1)).softmax(dim=-1)  # [B, h, m, N]
    return kernel_q @ (iterative_pinv(kernel_land, pinv_iterations) @ (kernel_k @ v))


def default_num_features(head_dim: int) -> int:
    """FAVOR+'s default feature count round(d·ln d) (at least 1)."""
    return max(1, round(head_dim * math.log(head_dim)))
