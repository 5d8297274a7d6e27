"""Every variant equals its explicit quadratic form: the N×N matrix from the papers, float64, N ≤ 256."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from attention_reference import (
    KNOWN_VARIANTS,
    focus,
    function_of,
    module_reference,
    parametrize_variants,
    variant_weights,
)
from torch import Tensor

from segattn.attention import (
    build_attention,
    efficient_attention,
    focused_feature_map,
    linear_attention,
    taylor_attention,
)

EXACT = 1e-10  # float64: the linear forms reorder sums of O(1) terms, so agreement is ~1e-14 in practice


def random_qkv(name: str, shape: tuple[int, ...], seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """float64 q, k, v; FLatten's kernel expects non-negative (already focused) q and k."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(shape, generator=gen, dtype=torch.float64) for _ in range(3))
    if name == "flatten":
        q, k = q.abs() + 1e-3, k.abs() + 1e-3
    return tuple(t.requires_grad_() for t in (q, k, v))


VARIANTS = parametrize_variants(KNOWN_VARIANTS)


@VARIANTS
def test_function_equals_quadratic_form_with_gradients(name: str, options: dict[str, Any]) -> None:
    q, k, v = random_qkv(name, (2, 3, 256, 8))
    out = function_of(name, options)(q, k, v)
    ref = variant_weights(name, options, q, k) @ v
    assert out.shape == ref.shape and out.dtype == torch.float64
    assert (out - ref).abs().max() <= EXACT

    upstream = torch.randn_like(ref)
    grads = torch.autograd.grad((out * upstream).sum(), (q, k, v))
    ref_grads = torch.autograd.grad((ref * upstream).sum(), (q, k, v))
    for grad, ref_grad in zip(grads, ref_grads, strict=True):
        assert (grad - ref_grad).abs().max() <= EXACT


@VARIANTS
def test_function_gradcheck(name: str, options: dict[str, Any]) -> None:
    assert torch.autograd.gradcheck(function_of(name, options), random_qkv(name, (1, 2, 5, 3), seed=1))


@VARIANTS
@pytest.mark.parametrize("hw", [(12, 20), (5, 3)])
def test_module_equals_reference_with_gradients(
    name: str, options: dict[str, Any], hw: tuple[int, int]
) -> None:
    torch.manual_seed(0)
    module = build_attention(name, 12, 3, **options).double()
    if name == "flatten":  # a non-trivial learnable scale, different per channel
        torch.nn.init.normal_(module.scale)
    x = torch.randn(2, hw[0] * hw[1], 12, dtype=torch.float64, requires_grad=True)
    out = module(x, hw)
    ref = module_reference(module, name, options, x, hw)
    assert (out - ref).abs().max() <= EXACT

    upstream = torch.randn_like(ref)
    inputs = (x, *module.parameters())
    grads = torch.autograd.grad((out * upstream).sum(), inputs)
    ref_grads = torch.autograd.grad((ref * upstream).sum(), inputs)
    for grad, ref_grad in zip(grads, ref_grads, strict=True):
        assert (grad - ref_grad).abs().max() <= EXACT


def test_flatten_module_matches_paper_at_two_resolutions() -> None:
    """Same weights at 8×8 and at the non-square 12×20: no parameter depends on the token count."""
    torch.manual_seed(0)
    module = build_attention("flatten", 16, 2, focusing_factor=3.0, kernel_size=5).double()
    torch.nn.init.normal_(module.scale)
    for hw in [(8, 8), (12, 20)]:
        x = torch.randn(1, hw[0] * hw[1], 16, dtype=torch.float64)
        assert (module(x, hw) - module_reference(module, "flatten", {}, x, hw)).abs().max() <= EXACT


def test_efficient_implied_matrix_rows_sum_to_one() -> None:
    q, k, _ = random_qkv("efficient", (2, 3, 64, 8))
    identity = torch.eye(64, dtype=torch.float64).expand(2, 3, 64, 64)
    weights = efficient_attention(q, k, identity)  # out = W · I = W
    assert weights.min() >= 0
    assert (weights.sum(dim=-1) - 1).abs().max() <= 1e-12


def test_efficient_scale_equals_qkt_over_n_times_v() -> None:
    q, k, v = random_qkv("efficient", (2, 3, 200, 8))
    expected = (q @ k.transpose(-2, -1) / 200) @ v
    assert (efficient_attention(q, k, v, normalization="scale") - expected).abs().max() <= EXACT


def test_eps_guards_degenerate_queries() -> None:
    """A zero query under Taylor attends uniformly; an all-negative query under relu gives exactly zero."""
    _, k, v = random_qkv("taylor", (1, 1, 10, 4))
    zero = torch.zeros(1, 1, 10, 4, dtype=torch.float64)
    assert (taylor_attention(zero, k, v) - v.sum(-2, keepdim=True) / (10 + 1e-6)).abs().max() <= EXACT
    assert torch.equal(linear_attention(-zero - 1, k, v, feature_map="relu"), zero)


@pytest.mark.parametrize("p", [2.0, 3.0, 4.5])
def test_focused_feature_map_keeps_norm_and_sharpens_direction(p: float) -> None:
    x = torch.rand(2, 50, 24, dtype=torch.float64) + 1e-6
    out = focused_feature_map(x, p)
    assert (out.norm(dim=-1) - x.norm(dim=-1)).abs().max() <= 1e-12
    ratio = out / x**p  # f_p(x) ∝ x^p per token
    assert (ratio / ratio[..., :1] - 1).abs().max() <= 1e-12
    assert (out - focus(x, p)).abs().max() <= 1e-12


def test_focused_feature_map_hand_computed() -> None:
    # x = (1, 2), p = 2: ‖x‖ = √5, x² = (1, 4), ‖x²‖ = √17.
    out = focused_feature_map(torch.tensor([[[1.0, 2.0]]], dtype=torch.float64), 2.0)
    expected = torch.tensor([[[1.0, 4.0]]], dtype=torch.float64) * (5 / 17) ** 0.5
    assert (out - expected).abs().max() <= 1e-15


@pytest.mark.parametrize(("p", "value"), [(3.0, 3e-8), (3.0, 1e-8), (4.0, 1.44e-6), (10.0, 100.0)])
def test_focused_feature_map_exact_in_fp32_for_tiny_and_large_tokens(p: float, value: float) -> None:
    """x^p of a token this small (all channels ≤ 0 before relu + 1e-6) or large under/overflows fp32."""
    x = torch.full((1, 1, 64), value)
    x[..., 0] *= 1.5
    exact = focus(x.double(), p)
    assert ((focused_feature_map(x, p).double() - exact).abs() / exact).max() <= 1e-5


def test_flatten_module_finite_when_a_token_has_no_positive_channel() -> None:
    """focusing_factor=4 and a token whose q, k channels are all ≤ 0: fp32 matches the float64 reference."""
    torch.manual_seed(0)
    module = build_attention("flatten", 64, 2, focusing_factor=4.0)
    with torch.no_grad():
        module.qkv.bias[:128] = -10.0  # every q and k channel negative for small inputs
    x = 0.01 * torch.randn(1, 16, 64)
    exact = module_reference(
        copy.deepcopy(module).double(), "flatten", {"focusing_factor": 4.0}, x.double(), (4, 4)
    )
    assert ((module(x, (4, 4)).double() - exact).abs()).max() <= 1e-5 * exact.abs().max()


def test_focused_feature_map_gradcheck() -> None:
    x = (torch.rand(1, 4, 6, dtype=torch.float64) + 0.1).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: focused_feature_map(t, 3.0), (x,))
