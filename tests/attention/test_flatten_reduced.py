"""FLatten-PVT's additions to ``flatten``: keys/values from the spatially reduced grid (``sr_ratio``) with the
DWC branch on V upsampled back, and a learned key position encoding stored on one grid
(``position_encoding='learned'``, ``position_size``) and resampled to the key grid; against the formula in
float64, Function and plain paths alike."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from attention_reference import focus
from torch import Tensor

from segattn.attention import build_attention
from segattn.layers import FUSED_ENV, resample_grid_embedding


def reduced_flatten_reference(
    module: torch.nn.Module, x: Tensor, hw: tuple[int, int], p: float = 3.0
) -> Tensor:
    """q from the tokens; k, v from LayerNorm(stride-R conv of the token grid); k += the key encoding
    bilinearly resampled from its stored grid; FLatten's focused kernel attention per head; plus the depthwise
    conv of each head's V, bilinearly upsampled from the key grid to (H, W)."""
    batch, _, channels = x.shape
    heads, r = module.num_heads, module.sr_ratio
    d = channels // heads
    w_q, w_k, w_v = module.qkv.weight.split(channels)
    b_q, b_k, b_v = module.qkv.bias.split(channels)
    if r == 1:
        kv_hw, reduced = hw, x
    else:
        image = x.transpose(1, 2).reshape(batch, channels, *hw)
        reduced = F.conv2d(image, module.sr.weight, module.sr.bias, stride=r)  # [B, C, H/R, W/R]
        kv_hw = tuple(reduced.shape[-2:])
        reduced = reduced.flatten(2).transpose(1, 2)
        reduced = F.layer_norm(reduced, (channels,), module.norm.weight, module.norm.bias, module.norm.eps)
    side = module.position_size
    stored = module.positional_encoding.reshape(1, side, side, channels).permute(0, 3, 1, 2)
    pos = F.interpolate(stored, size=kv_hw, mode="bilinear", align_corners=False).flatten(2).transpose(1, 2)
    q, k, v = x @ w_q.T + b_q, reduced @ w_k.T + b_k + pos, reduced @ w_v.T + b_v
    softplus = torch.log1p(module.scale.exp())
    q, k = (focus((t.clamp(min=0) + 1e-6) / softplus, p) for t in (q, k))
    out = []
    for h in range(heads):
        cols = slice(h * d, (h + 1) * d)
        q_h, k_h, v_h = q[..., cols], k[..., cols], v[..., cols]
        attended = (q_h @ (k_h.transpose(1, 2) @ v_h) / k_h.shape[1]) / (
            q_h @ k_h.mean(1, keepdim=True).transpose(1, 2) + module.eps
        )
        grid = v_h.transpose(1, 2).reshape(batch, d, *kv_hw)
        grid = F.interpolate(grid, size=hw, mode="bilinear", align_corners=False)
        local = F.conv2d(grid, module.dwc.weight, module.dwc.bias, padding=module.dwc.padding, groups=d)
        out.append(attended + local.flatten(2).transpose(1, 2))
    return torch.cat(out, dim=-1) @ module.proj.weight.T + module.proj.bias


@pytest.mark.parametrize("functions", ["1", "0"])
@pytest.mark.parametrize(("sr_ratio", "hw"), [(2, (8, 12)), (3, (7, 10)), (2, (8, 8)), (1, (6, 9))])
def test_reduced_flatten_with_key_encoding_equals_formula(
    monkeypatch: pytest.MonkeyPatch, functions: str, sr_ratio: int, hw: tuple[int, int]
) -> None:
    """Non-square grids, one not a multiple of R (the conv drops the remainder), key grids other than the
    stored 4×4 one and that one (8×8 at R = 2); outputs and input gradients."""
    monkeypatch.setenv(FUSED_ENV, functions)
    torch.manual_seed(0)
    module = build_attention(
        "flatten", 16, 2, sr_ratio=sr_ratio, position_encoding="learned", position_size=4 * sr_ratio
    ).double()
    with torch.no_grad():
        for param in module.parameters():
            param.add_(0.3 * torch.randn_like(param))
    x = torch.randn(2, hw[0] * hw[1], 16, dtype=torch.float64, requires_grad=True)
    ours = module(x, hw)
    expected = reduced_flatten_reference(module, x, hw)
    torch.testing.assert_close(ours, expected, rtol=1e-9, atol=1e-10)
    weights = torch.randn_like(ours)
    (grad,) = torch.autograd.grad((ours * weights).sum(), x)
    (grad_expected,) = torch.autograd.grad((expected * weights).sum(), x)
    torch.testing.assert_close(grad, grad_expected, rtol=1e-8, atol=1e-10)


def test_resampled_encoding_is_the_stored_one_at_its_grid_and_bilinear_elsewhere() -> None:
    stored = torch.randn(1, 3 * 5, 4)
    assert torch.equal(resample_grid_embedding(stored, (3, 5), (3, 5)), stored)
    grid = stored.reshape(1, 3, 5, 4).permute(0, 3, 1, 2)  # token n -> (n // 5, n % 5)
    expected = F.interpolate(grid, size=(4, 7), mode="bilinear", align_corners=False)
    assert torch.equal(resample_grid_embedding(stored, (3, 5), (4, 7)), expected.flatten(2).transpose(1, 2))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"position_encoding": "sine"}, "position_encoding='sine'"),
        ({"position_size": 4, "sr_ratio": 8}, "position_size=4"),
        ({"sr_ratio": 0}, "sr_ratio=0"),
    ],
)
def test_bad_reduction_options_name_the_option(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_attention("flatten", 16, 2, **options)
