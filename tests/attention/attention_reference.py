"""Independent definitions the attention tests compare against, written from the papers' formulas, plus
the variant lists and helpers the tests share.

Each ``*_weights`` function builds the explicit N×N attention matrix W (so out = W v) with plain tensor ops,
never calling segattn; ``module_reference`` uses only a module's parameters. ``ShapeRecorder`` records
what every aten op produces, to prove the absence of N×N tensors. Tokens are laid out row-major over the
(H, W) grid: token n sits at row n // W, column n % W.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from segattn.attention import (
    AttentionBase,
    attention_class,
    available_attention,
    build_attention,
    efficient_attention,
    focused_linear_attention,
    linear_attention,
    lite_linear_attention,
    softmax_attention,
    taylor_attention,
)

# (registry name, options) for the variants whose published definitions the tests spell out below.
KNOWN_VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("softmax", {}),
    ("efficient", {"normalization": "softmax"}),
    ("efficient", {"normalization": "scale"}),
    ("linear", {"feature_map": "elu"}),
    ("linear", {"feature_map": "relu"}),
    ("taylor", {}),
    ("flatten", {}),
    ("litemla", {}),
]


def all_variants() -> list[tuple[str, dict[str, Any]]]:
    """The known variants plus every other registered name with its default options."""
    known = {name for name, _ in KNOWN_VARIANTS}
    return KNOWN_VARIANTS + [(name, {}) for name in available_attention() if name not in known]


def linear_variants() -> list[tuple[str, dict[str, Any]]]:
    """Registered variants that claim sub-quadratic cost (class flag ``quadratic`` is False)."""
    return [(name, options) for name, options in all_variants() if not attention_class(name).quadratic]


def build_for_tokens(name: str, options: dict[str, Any], dim: int, heads: int, tokens: int) -> AttentionBase:
    """Build a variant, skipping the test when the variant declares a token limit below ``tokens``."""
    module = build_attention(name, dim, heads, **options)
    if module.max_tokens is not None and tokens > module.max_tokens:
        pytest.skip(f"{name} declares max_tokens={module.max_tokens} < {tokens}")
    return module


def build_perturbed(name: str, options: dict[str, Any], dim: int, heads: int, tokens: int) -> AttentionBase:
    """The variant in eval mode (no Performer redraw between runs) with every parameter moved off its
    initial value (FLatten's ``scale`` starts at 0), seeded."""
    torch.manual_seed(0)
    module = build_for_tokens(name, options, dim, heads, tokens).eval()
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return module


def variant_id(name: str, options: dict[str, Any]) -> str:
    return "-".join([name, *(str(value) for value in options.values())])


def parametrize_variants(variants: list[tuple[str, dict[str, Any]]]):
    """``@pytest.mark.parametrize("name, options", ...)`` with readable ids."""
    return pytest.mark.parametrize(
        ("name", "options"),
        [pytest.param(name, options, id=variant_id(name, options)) for name, options in variants],
    )


def _softmax(x: Tensor, dim: int) -> Tensor:
    e = (x - x.amax(dim=dim, keepdim=True)).exp()
    return e / e.sum(dim=dim, keepdim=True)


def softmax_weights(q: Tensor, k: Tensor) -> Tensor:
    """W = softmax_row(q kᵀ / √d)."""
    return _softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)


def efficient_weights(q: Tensor, k: Tensor, normalization: str) -> Tensor:
    """W = ρq(q) ρk(k)ᵀ: softmax of q over channels and of k over positions, or q kᵀ / N."""
    if normalization == "scale":
        return q @ k.transpose(-2, -1) / k.shape[-2]
    return _softmax(q, dim=-1) @ _softmax(k, dim=-2).transpose(-2, -1)


def linear_weights(q: Tensor, k: Tensor, feature_map: str, eps: float = 1e-6) -> Tensor:
    """W_ij = φ(q_i)·φ(k_j) / (Σ_j φ(q_i)·φ(k_j) + eps), φ = elu + 1 or relu."""
    phi = (
        (lambda x: torch.where(x > 0, x + 1, x.exp())) if feature_map == "elu" else (lambda x: x.clamp(min=0))
    )
    sim = phi(q) @ phi(k).transpose(-2, -1)
    return sim / (sim.sum(dim=-1, keepdim=True) + eps)


def taylor_weights(q: Tensor, k: Tensor, eps: float = 1e-6) -> Tensor:
    """W_ij = (1 + q̂_i·k̂_j) / (Σ_j (1 + q̂_i·k̂_j) + eps), q̂ = q / max(‖q‖, eps) per position."""
    q_hat = q / q.square().sum(dim=-1, keepdim=True).sqrt().clamp(min=eps)
    k_hat = k / k.square().sum(dim=-1, keepdim=True).sqrt().clamp(min=eps)
    sim = 1 + q_hat @ k_hat.transpose(-2, -1)
    return sim / (sim.sum(dim=-1, keepdim=True) + eps)


def focused_kernel_weights(q: Tensor, k: Tensor, eps: float = 1e-6) -> Tensor:
    """FLatten with φ = identity: W_ij = (q_i·k_j / N) / (mean_j q_i·k_j + eps)."""
    sim = q @ k.transpose(-2, -1)
    return (sim / k.shape[-2]) / (sim.mean(dim=-1, keepdim=True) + eps)


def variant_weights(name: str, options: dict[str, Any], q: Tensor, k: Tensor) -> Tensor:
    """The N×N matrix of a known variant (flatten: its kernel on already focused q, k)."""
    if name == "softmax":
        return softmax_weights(q, k)
    if name == "efficient":
        return efficient_weights(q, k, options.get("normalization", "softmax"))
    if name == "linear":
        return linear_weights(q, k, options.get("feature_map", "elu"))
    if name == "taylor":
        return taylor_weights(q, k)
    if name == "flatten":
        return focused_kernel_weights(q, k)
    if name == "litemla":
        return linear_weights(q, k, "relu", eps=1e-5)
    raise KeyError(name)


def focus(x: Tensor, p: float) -> Tensor:
    """f_p(x) = ‖x‖ · x^p / ‖x^p‖ over the last dim."""
    x_p = x**p
    return x.square().sum(-1, keepdim=True).sqrt() * x_p / x_p.square().sum(-1, keepdim=True).sqrt()


def depthwise_conv(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """Zero-padded 'same' depthwise conv by summing shifted copies; x: [c, H, W], weight: [c, 1, k, k]."""
    size = weight.shape[-1]
    pad = size // 2
    height, width = x.shape[-2:]
    padded = x.new_zeros(x.shape[0], height + 2 * pad, width + 2 * pad)
    padded[:, pad : pad + height, pad : pad + width] = x
    out = bias[:, None, None].expand_as(x).clone()
    for a in range(size):
        for b in range(size):
            out = out + weight[:, 0, a, b, None, None] * padded[:, a : a + height, b : b + width]
    return out


def split_qkv(x: Tensor, weight: Tensor, bias: Tensor | None, heads: int) -> tuple[Tensor, Tensor, Tensor]:
    """timm's layout: qkv = x Wᵀ + b, channels [q | k | v], each head a contiguous block of d channels."""
    qkv = x @ weight.T + (0 if bias is None else bias)
    batch, tokens, channels = x.shape
    return tuple(
        t.reshape(batch, tokens, heads, channels // heads).transpose(1, 2)
        for t in qkv.split(channels, dim=-1)
    )


def merge(x: Tensor) -> Tensor:
    return x.transpose(1, 2).flatten(2)


def function_of(name: str, options: dict[str, Any]) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    """The function under test for a known variant: its public functional-core entry point (for flatten,
    the kernel product on already focused q, k)."""
    functions = {
        "softmax": lambda q, k, v: softmax_attention(q, k, v),
        "efficient": lambda q, k, v: efficient_attention(q, k, v, options.get("normalization", "softmax")),
        "linear": lambda q, k, v: linear_attention(q, k, v, options.get("feature_map", "elu")),
        "taylor": taylor_attention,
        "flatten": focused_linear_attention,
        "litemla": lite_linear_attention,
    }
    return functions[name]


def module_reference(module: torch.nn.Module, name: str, options: dict[str, Any], x: Tensor, hw) -> Tensor:
    """A known variant's module output from its parameters: x -> qkv -> explicit W per head -> proj."""
    if name == "flatten":
        return flatten_reference(module, x, hw, options.get("focusing_factor", 3.0))
    if name == "litemla":
        return litemla_reference(module, x, hw)
    q, k, v = split_qkv(x, module.qkv.weight, module.qkv.bias, module.num_heads)
    return merge(variant_weights(name, options, q, k) @ v) @ module.proj.weight.T + module.proj.bias


def flatten_reference(module: torch.nn.Module, x: Tensor, hw, p: float = 3.0, eps: float = 1e-6) -> Tensor:
    """FLatten (Han et al. 2023) from the paper: relu + 1e-6, / softplus(scale), f_p over all C channels,
    per-head kernel attention with φ = identity, plus one depthwise conv of each head's V (shared weights)."""
    heads, channels = module.num_heads, x.shape[-1]
    d = channels // heads
    qkv = x @ module.qkv.weight.T + module.qkv.bias
    q, k, v = qkv.split(channels, dim=-1)
    softplus = torch.log1p(module.scale.exp())
    q = focus((q.clamp(min=0) + 1e-6) / softplus, p)
    k = focus((k.clamp(min=0) + 1e-6) / softplus, p)
    height, width = hw
    outputs = []
    for b in range(x.shape[0]):
        per_head = []
        for h in range(heads):
            block = slice(h * d, (h + 1) * d)
            q_h, k_h, v_h = q[b, :, block], k[b, :, block], v[b, :, block]  # [N, d]
            attended = focused_kernel_weights(q_h, k_h, eps) @ v_h
            grid = v_h.T.reshape(d, height, width)  # token n -> (n // W, n % W)
            local = depthwise_conv(grid, module.dwc.weight, module.dwc.bias).reshape(d, -1).T
            per_head.append(attended + local)
        outputs.append(torch.cat(per_head, dim=-1))
    return torch.stack(outputs) @ module.proj.weight.T + module.proj.bias


def litemla_reference(module: torch.nn.Module, x: Tensor, hw, eps: float = 1e-5) -> Tensor:
    """LiteMLA (Cai et al. 2023) from the paper: one projection to [q | k | v], each C = heads·d channels;
    per scale, every channel through a depthwise s×s conv and each head's q, k, v through its own
    d×d 1×1 conv, giving as many heads again; per head W_ij = ReLU(q_i)·ReLU(k_j) / (Σ_j ReLU(q_i)·ReLU(k_j)
    + eps) over the same scale's tokens; all heads' outputs concatenated, projected, BatchNorm (batch
    statistics over B·N tokens in training, running ones in eval)."""
    d = module.head_dim
    qkv = x @ module.qkv.weight.T  # [B, N, 3C]
    height, width = hw
    scales = [qkv]
    for depthwise, pointwise in module.aggreg:
        mixed = []
        for tokens in qkv:  # [N, 3C] -> [3C, H, W] (token n at row n // W, column n % W)
            grid = depthwise_conv(
                tokens.T.reshape(-1, height, width), depthwise.weight, torch.zeros(3 * x.shape[-1])
            )
            blocks = grid.reshape(-1, d, height * width)  # [3·heads, d, N]: one group per head and q/k/v
            groups = pointwise.weight[:, :, 0, 0].reshape(-1, d, d)  # [3·heads, d_out, d_in]
            mixed.append((groups @ blocks).reshape(-1, height * width).T)
        scales.append(torch.stack(mixed))
    heads = torch.stack(scales, dim=2).unflatten(-1, (3, -1, d))  # [B, N, 1 + S, 3, heads, d]
    q, k, v = (heads[:, :, :, i].flatten(2, 3).transpose(1, 2) for i in range(3))  # [B, heads', N, d]
    out = merge(linear_weights(q, k, "relu", eps) @ v) @ module.proj[0].weight.T  # [B, N, C]
    norm = module.proj[1]
    if norm.training:
        mean = out.mean(dim=(0, 1))
        var = ((out - mean) ** 2).mean(dim=(0, 1))
    else:
        mean, var = norm.running_mean, norm.running_var
    return (out - mean) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias


class ShapeRecorder(TorchDispatchMode):
    """Records (op, output shape) for every aten op run while active, forward and backward alike."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple[str, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_flatten(out)[0]:
            if isinstance(leaf, Tensor):
                self.records.append((str(func), tuple(leaf.shape)))
        return out

    def quadratic(self, n: int) -> list[tuple[str, tuple[int, ...]]]:
        """Records whose output has at least two dimensions of size >= n."""
        return [(op, shape) for op, shape in self.records if sum(size >= n for size in shape) >= 2]
