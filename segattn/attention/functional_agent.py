"""Agent attention (Han et al. 2024, arXiv 2312.08874) and PolaFormer's polarity-aware linear attention
(Meng et al. 2025, arXiv 2501.15061): pure math on [B, heads, N, d] tensors, no N×N tensor.

Agent attention routes N queries through n ≪ N agent tokens: two softmax attentions of size N×n and n×M.
Softmax, its normaliser and the polarity feature maps run in fp32 under bf16/fp16 autocast (float64 stays
float64); results come back in the dtype of ``v``. The pooling matrices (and the bias resampling,
``layers.resample_grid``) are built from the grid size with ``arange``, so exported graphs keep H and W
dynamic.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..layers import FUNCTION, HW, choose_path
from .autograd.polarity import polarity_features_function
from .functional import _upcast, full_precision
from .functional_approx import segment_averaging

__all__ = [
    "adaptive_pooling_matrix",
    "agent_attention",
    "agent_tokens",
    "pola_attention",
]

AGENT_POOLINGS = ("grid", "segments")


def adaptive_pooling_matrix(size: int, out: int, like: Tensor) -> Tensor:
    """The [out, size] matrix of ``adaptive_avg_pool1d``: row i averages inputs ⌊i·size/out⌋ to
    ⌈(i+1)·size/out⌉ − 1 (windows overlap when ``size`` is not a multiple of ``out``, repeat when smaller)."""
    index = torch.arange(out, device=like.device)
    start = (index * size) // out
    stop = ((index + 1) * size + out - 1) // out
    positions = torch.arange(size, device=like.device)
    member = (positions >= start[:, None]) & (positions < stop[:, None])
    return member.to(like.dtype) / (stop - start).to(like.dtype)[:, None]


def agent_tokens(q: Tensor, hw: HW, agent_num: int, pooling: str = "grid") -> Tensor:
    """n agent tokens pooled from queries [..., N, C] on the (H, W) grid: [..., n, C].

    ``grid``: adaptive average pooling of the query grid to √n×√n (the paper's; n a perfect square).
    ``segments``: means of n consecutive segments of the row-major token sequence (any n; Nyström's
    landmarks).
    """
    if pooling == "segments":
        return segment_averaging(q, agent_num) @ q
    if pooling != "grid":
        raise ValueError(f"agent_tokens: pooling={pooling!r}; expected one of {AGENT_POOLINGS}")
    side = math.isqrt(agent_num)
    rows = adaptive_pooling_matrix(hw[0], side, q)  # [√n, H]
    cols = adaptive_pooling_matrix(hw[1], side, q)  # [√n, W]
    pool = (rows[:, None, :, None] * cols[None, :, None, :]).reshape(side * side, -1)  # [n, N]
    return pool @ q


@full_precision
def agent_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    hw: HW,
    agent_bias: Tensor,
    query_bias: Tensor,
    agent_num: int,
    pooling: str = "grid",
) -> Tensor:
    """O = softmax(s·Q Aᵀ + B_q) · (softmax(s·A Kᵀ + B_a) V), s = d^-½, with n agents A pooled from Q
    (``agent_tokens``): agents first attend to keys/values (n×M), then queries to agents (N×n); O(N·n·d).

    q: [B, h, N, d] on the (H, W) grid ``hw``; k, v: [B, h, M, d]; agent_bias B_a: [h, n, M] and query_bias
    B_q: [h, N, n] for n = ``agent_num`` agents.
    """
    agent_bias, query_bias = _upcast(agent_bias), _upcast(query_bias)
    scale = q.shape[-1] ** -0.5
    agents = agent_tokens(q, hw, agent_num, pooling)  # [B, h, n, d]
    agent_v = ((agents * scale) @ k.transpose(-2, -1) + agent_bias).softmax(dim=-1) @ v  # [B, h, n, d]
    return ((q * scale) @ agents.transpose(-2, -1) + query_bias).softmax(dim=-1) @ agent_v


def polarity_features(x: Tensor, power: Tensor, backend: str | None = None) -> Tensor:
    """[φ(x), φ(−x)] with φ(x) = relu(x)^p: |x|^p split by the sign of x (one power, not two); [..., 2d].
    One autograd node with a hand-written backward (``autograd.polarity``) where ``layers.choose_path`` says
    so under ``backend`` (the module's ``kernel_backend``)."""
    if choose_path(backend, x) == FUNCTION:
        return polarity_features_function(x, power)
    magnitude = x.abs() ** power
    positive = torch.where(x > 0, magnitude, 0.0)
    return torch.cat([positive, magnitude - positive], dim=-1)


def swap_halves(x: Tensor) -> Tensor:
    """Exchange the two halves of dim −2 ([φ(x), φ(−x)] rows ↔ [φ(−x), φ(x)] rows)."""
    half = x.shape[-2] // 2
    return torch.cat([x[..., half:, :], x[..., :half, :]], dim=-2)


@full_precision
def pola_attention(
    q: Tensor, k: Tensor, v: Tensor, power: Tensor, eps: float = 1e-6, backend: str | None = None
) -> Tensor:
    """Polarity-aware linear attention on q, k already scaled (and k position-encoded).

    With φ(x) = relu(x)^p (p per channel, ``power`` broadcastable to [h, 1, d]), q± = φ(±q), k± = φ(±k):
    same-sign similarity S_ij = q⁺_i·k⁺_j + q⁻_i·k⁻_j weighs the first half of v's channels, opposite-sign
    O_ij = q⁻_i·k⁺_j + q⁺_i·k⁻_j the second: out_i = [Σ_j S_ij v¹_j / (Σ_j S_ij + M·eps),
    Σ_j O_ij v²_j / (Σ_j O_ij + M·eps)]. As published, eps is added to the mean over keys (Σ_j / M) and
    kᵀv is formed as (kᵀ/√M)(v/√M). q: [B, h, N, d]; k, v: [B, h, M, d], d even.

    O_ij is [q⁺, q⁻]_i · [k⁻, k⁺]_j, so both halves come from the one feature matrix [q⁺, q⁻] against a
    [2d, d] context whose second half has its key rows swapped: one product for the numerators, one for
    the two normalisers.
    """
    m, half = k.shape[-2], v.shape[-1] // 2
    queries, keys = (polarity_features(x, power, backend) for x in (q, k))  # [.., N, 2d], [.., M, 2d]
    context = (keys.transpose(-2, -1) * m**-0.5) @ (v * m**-0.5)  # [B, h, 2d, d]
    context = torch.cat([context[..., :half], swap_halves(context[..., half:])], dim=-1)
    key_mean = keys.mean(dim=-2).unsqueeze(-1)  # [B, h, 2d, 1]
    normalizer = queries @ torch.cat([key_mean, swap_halves(key_mean)], dim=-1) + eps  # [B, h, N, 2]
    out = queries @ context  # [B, h, N, d]
    return torch.cat([out[..., :half] / normalizer[..., :1], out[..., half:] / normalizer[..., 1:]], dim=-1)
