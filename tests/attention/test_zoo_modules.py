"""Attention modules: registry errors, timm weight compatibility, any resolution, no N×N tensors."""

from __future__ import annotations

import io
import re
from typing import Any

import pytest
import timm.models.pvt_v2
import torch
from attention_reference import (
    KNOWN_VARIANTS,
    ShapeRecorder,
    all_variants,
    build_for_tokens,
    linear_variants,
    module_reference,
    parametrize_variants,
)
from timm.layers import Attention as TimmAttention

from segattn.attention import attention_class, available_attention, build_attention

# Parameters a variant adds on top of timm's Attention, as documented in its class docstring.
DOCUMENTED_EXTRAS = {"flatten": {"scale", "dwc.weight", "dwc.bias"}}
# Variants whose published layout timm's Attention weights cannot fit; their own weights are tested elsewhere.
OWN_LAYOUT = {
    "litemla": "EfficientViT's bias-free qkv and (1 + S)·C→C proj + BatchNorm; timm's efficientvit_* "
    "weights load instead (tests/models/test_efficientvit.py)",
}


def test_unknown_attention_name_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="nope") as info:
        build_attention("nope", 32, 2)
    assert all(name in str(info.value) for name in available_attention())
    with pytest.raises(ValueError, match="nope"):
        attention_class("nope")


def test_unknown_option_lists_valid_options() -> None:
    with pytest.raises(ValueError, match="no_such_option") as info:
        build_attention("linear", 32, 2, no_such_option=1)
    assert "feature_map" in str(info.value)


@pytest.mark.parametrize(
    ("name", "options"),
    [("efficient", {"normalization": "bogus"}), ("linear", {"feature_map": "bogus"})],
)
def test_invalid_option_value_names_it(name: str, options: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="bogus"):
        build_attention(name, 32, 2, **options)


@parametrize_variants(all_variants())
def test_token_count_must_match_grid(name: str, options: dict[str, Any]) -> None:
    module = build_attention(name, 32, 2, **options)
    with pytest.raises(ValueError, match=r"N=30\b.*H\*W=35\b"):
        module(torch.randn(1, 30, 32), (5, 7))


@parametrize_variants(all_variants())
def test_dim_must_divide_into_heads(name: str, options: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"dim=30.*num_heads=4"):
        build_attention(name, 30, 4, **options)


@parametrize_variants(all_variants())
def test_timm_attention_weights_load_with_only_documented_extras_missing(
    name: str, options: dict[str, Any]
) -> None:
    if name in OWN_LAYOUT:
        pytest.skip(OWN_LAYOUT[name])
    timm_attention = TimmAttention(32, num_heads=2, qkv_bias=True)
    module = build_attention(name, 32, 2, **options)
    result = module.load_state_dict(timm_attention.state_dict(), strict=False)
    assert result.unexpected_keys == []
    missing = set(result.missing_keys)
    if name in {n for n, _ in KNOWN_VARIANTS}:
        assert missing == DOCUMENTED_EXTRAS.get(name, set())
    else:  # a variant added later: each extra must be named in its class (or a parent's) docstring
        doc = " ".join(cls.__doc__ or "" for cls in attention_class(name).__mro__)
        undocumented = {key for key in missing if not re.search(rf"\b{key.split('.')[0]}\b", doc)}
        assert not undocumented, f"{name}: extra parameters {undocumented} are not documented"
    for key, value in timm_attention.state_dict().items():
        assert torch.equal(module.state_dict()[key], value)


def test_softmax_equals_timm_attention() -> None:
    torch.manual_seed(0)
    timm_attention = TimmAttention(32, num_heads=4, qkv_bias=True).eval()
    module = build_attention("softmax", 32, 4).eval()
    module.load_state_dict(timm_attention.state_dict())
    x = torch.randn(2, 6 * 10, 32)
    assert (module(x, (6, 10)) - timm_attention(x)).abs().max() <= 1e-6


def test_softmax_spatial_reduction_equals_timm_pvt_v2() -> None:
    """timm pvt_v2 ``q`` and ``kv`` weights are rows [0:C] and [C:3C] of our ``qkv``."""
    torch.manual_seed(0)
    pvt = timm.models.pvt_v2.Attention(32, num_heads=2, sr_ratio=2, qkv_bias=True).eval()
    module = build_attention("softmax", 32, 2, sr_ratio=2).eval()
    weights = pvt.state_dict()
    for suffix in ("weight", "bias"):
        weights[f"qkv.{suffix}"] = torch.cat([weights.pop(f"q.{suffix}"), weights.pop(f"kv.{suffix}")])
    module.load_state_dict(weights)
    x = torch.randn(2, 8 * 12, 32)
    assert (module(x, (8, 12)) - pvt(x, [8, 12])).abs().max() <= 1e-6


@parametrize_variants(linear_variants())
def test_any_resolution_with_the_same_weights(name: str, options: dict[str, Any]) -> None:
    """One module, square then non-square grid (12×20): right shape, finite, mixes across tokens."""
    torch.manual_seed(0)
    module = build_for_tokens(name, options, 32, 2, 12 * 20)
    for hw in [(8, 8), (12, 20)]:
        x = torch.randn(2, hw[0] * hw[1], 32)
        out = module(x, hw)
        assert out.shape == x.shape and torch.isfinite(out).all()
        x_moved = x.clone()
        x_moved[:, -1] += 1.0  # the last token changes the output of the first: tokens are mixed
        assert not torch.allclose(module(x_moved, hw)[:, 0], out[:, 0])


@parametrize_variants(all_variants())
def test_state_dict_round_trip(name: str, options: dict[str, Any]) -> None:
    torch.manual_seed(0)
    source = build_for_tokens(name, options, 32, 2, 12 * 20).eval()
    with torch.no_grad():
        for param in source.parameters():
            param.add_(0.1 * torch.randn_like(param))  # away from init (e.g. FLatten's zero scale)
    buffer = io.BytesIO()
    torch.save(source.state_dict(), buffer)
    buffer.seek(0)
    torch.manual_seed(1)
    target = build_attention(name, 32, 2, **options).eval()
    target.load_state_dict(torch.load(buffer, weights_only=True))
    x = torch.randn(2, 12 * 20, 32)
    assert torch.equal(target(x, (12, 20)), source(x, (12, 20)))


@parametrize_variants(linear_variants())
def test_no_tensor_with_two_dims_of_size_n(name: str, options: dict[str, Any]) -> None:
    """Every tensor made during forward + backward at N = 4096 (64×64) has at most one dim ≥ N."""
    n = 64 * 64
    module = build_for_tokens(name, options, 32, 2, n)
    x = torch.randn(1, n, 32, requires_grad=True)
    with ShapeRecorder() as recorder:
        module(x, (64, 64)).square().mean().backward()
    assert any(op.startswith("aten.mm") for op, _ in recorder.records)  # backward was recorded too
    assert recorder.quadratic(n) == []


def test_shape_recorder_flags_explicit_softmax() -> None:
    """The recorder does catch the quadratic baseline when written out explicitly (so the test can fail)."""
    n = 32 * 32
    module = build_attention("softmax", 32, 2)
    x = torch.randn(1, n, 32, requires_grad=True)
    with ShapeRecorder() as recorder:
        module_reference(module, "softmax", {}, x, (32, 32)).square().mean().backward()
    flagged = recorder.quadratic(n)
    assert flagged and all(re.fullmatch(r"aten\.\w+\.\w+", op) for op, _ in flagged)
    assert (1, 2, n, n) in {shape for _, shape in flagged}
