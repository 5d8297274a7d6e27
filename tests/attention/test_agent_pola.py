"""Agent attention and PolaFormer against explicit quadratic definitions written from their papers (issue 17).

The references below build the N×M attention matrices with plain float64 tensor ops and use only the
modules' parameters; resampling is spelled out as PyTorch's half-pixel linear interpolation matrices and
pooling as the adaptive-average windows. The shared zoo tests (bf16 at 16k tokens, no N×N tensor at 4096,
any resolution, state dicts, ONNX/TorchScript/compile) cover both variants through the registry.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from attention_reference import depthwise_conv
from omegaconf import OmegaConf
from torch import Tensor

from segattn.attention import (
    adaptive_pooling_matrix,
    agent_attention,
    attention_class,
    build_attention,
    pola_attention,
)
from segattn.layers import resample_grid
from segattn.models import build_model

CONF = Path(__file__).resolve().parents[2] / "conf" / "attention"


def interpolation(out: int, size: int) -> Tensor:
    """[out, size] matrix of 1-D linear interpolation with half-pixel centres (align_corners=False)."""
    matrix = torch.zeros(out, size, dtype=torch.float64)
    for i in range(out):
        source = max((i + 0.5) * size / out - 0.5, 0.0)
        low = math.floor(source)
        high, frac = min(low + 1, size - 1), source - low
        matrix[i, low] += 1 - frac
        matrix[i, high] += frac
    return matrix


def resample(maps: Tensor, hw: tuple[int, int]) -> Tensor:
    """Bilinear resampling of [..., h, w] maps as two 1-D interpolations."""
    return interpolation(hw[0], maps.shape[-2]) @ maps @ interpolation(hw[1], maps.shape[-1]).T


def stretch(rows: Tensor, size: int) -> Tensor:
    """Each row of [n, s] linearly resampled to ``size`` entries: [n, size]."""
    return rows @ interpolation(size, rows.shape[-1]).T


def window(i: int, size: int, out: int) -> slice:
    return slice(math.floor(i * size / out), math.ceil((i + 1) * size / out))


def reduce_tokens(module: torch.nn.Module, x: Tensor, hw: tuple[int, int]) -> tuple[Tensor, tuple[int, int]]:
    """PVT: the R×R patches of the grid through the stride-R conv (patch · weight), then LayerNorm."""
    r, (height, width), channels = module.sr_ratio, hw, x.shape[-1]
    if r == 1:
        return x, hw
    grid = x.reshape(x.shape[0], height, width, channels)[:, : height // r * r, : width // r * r]
    patches = grid.reshape(x.shape[0], height // r, r, width // r, r, channels).permute(0, 1, 3, 5, 2, 4)
    reduced = (patches.flatten(3) @ module.sr.weight.flatten(1).T + module.sr.bias).flatten(1, 2)
    mean = reduced.mean(-1, keepdim=True)
    var = ((reduced - mean) ** 2).mean(-1, keepdim=True)
    normed = (reduced - mean) / torch.sqrt(var + module.norm.eps) * module.norm.weight + module.norm.bias
    return normed, (height // r, width // r)


def project(module: torch.nn.Module, x: Tensor, hw: tuple[int, int]) -> tuple[Tensor, Tensor, Tensor, tuple]:
    """q from x, k and v from the (reduced) grid: [B, N, C], [B, M, C], [B, M, C], key grid."""
    c = x.shape[-1]
    weight, bias = module.qkv.weight, module.qkv.bias
    reduced, key_hw = reduce_tokens(module, x, hw)
    q = x @ weight[:c].T + bias[:c]
    k = reduced @ weight[c : 2 * c].T + bias[c : 2 * c]
    v = reduced @ weight[2 * c :].T + bias[2 * c :]
    return q, k, v, key_hw


def upsampled_images(v: Tensor, key_hw: tuple[int, int], hw: tuple[int, int]) -> Tensor:
    """[M, c] values as a [c, Hk, Wk] image, resampled to the query grid when it is smaller."""
    image = v.T.reshape(-1, *key_hw)
    return image if key_hw == hw else resample(image, hw)


def agent_reference(module: torch.nn.Module, x: Tensor, hw: tuple[int, int]) -> Tensor:
    """O = softmax(s·Q Aᵀ + B_q) softmax(s·A Kᵀ + B_a) V + DWC(V), A = adaptive average pool of Q."""
    q, k, v, key_hw = project(module, x, hw)
    heads, c = module.num_heads, x.shape[-1]
    d, n = c // heads, module.agent_num
    side = math.isqrt(n)
    (height, width), scale = hw, d**-0.5
    outputs = []
    for b in range(x.shape[0]):
        per_head = []
        grid = q[b].reshape(height, width, c)
        agents_all = torch.stack(
            [
                grid[window(i, height, side), window(j, width, side)].mean((0, 1))
                for i in range(side)
                for j in range(side)
            ]
        )  # [n, C]
        for h in range(heads):
            block = slice(h * d, (h + 1) * d)
            q_h, k_h, v_h, a_h = q[b, :, block], k[b, :, block], v[b, :, block], agents_all[:, block]
            ah, aw = module.ah_bias[0, h, :, :, 0], module.aw_bias[0, h, :, 0, :]  # [n, S/R]
            ha, wa = module.ha_bias[0, h, :, 0, :].T, module.wa_bias[0, h, 0, :, :].T  # [n, S]
            agent_bias = (
                resample(module.an_bias[h], key_hw)
                + stretch(ah, key_hw[0])[:, :, None]
                + stretch(aw, key_hw[1])[:, None, :]
            ).reshape(n, -1)  # [n, M]
            query_bias = (
                (
                    resample(module.na_bias[h], hw)
                    + stretch(ha, height)[:, :, None]
                    + stretch(wa, width)[:, None, :]
                )
                .reshape(n, -1)
                .T
            )  # [N, n]
            weights = (scale * q_h @ a_h.T + query_bias).softmax(-1) @ (
                scale * a_h @ k_h.T + agent_bias
            ).softmax(-1)  # [N, M]
            per_head.append(weights @ v_h)
        image = upsampled_images(v[b], key_hw, hw)
        local = depthwise_conv(image, module.dwc.weight, module.dwc.bias).reshape(c, -1).T
        outputs.append(torch.cat(per_head, dim=-1) + local)
    return torch.stack(outputs) @ module.proj.weight.T + module.proj.bias


def pola_reference(module: torch.nn.Module, x: Tensor, hw: tuple[int, int], eps: float = 1e-6) -> Tensor:
    """PolaFormer: S = q⁺k⁺ᵀ + q⁻k⁻ᵀ weighs v's first half, O = q⁻k⁺ᵀ + q⁺k⁻ᵀ the second, each divided
    by (its row sum / M + eps); plus the shared per-head DWC of V; times the gate; proj."""
    q, k, v, key_hw = project(module, x, hw)
    heads, c = module.num_heads, x.shape[-1]
    d = c // heads
    gate = x @ module.gate.weight.T + module.gate.bias
    if module.positional_encoding is not None:
        size = module.position_size
        stored = module.positional_encoding[0].T.reshape(c, size, size)
        k = k + resample(stored, key_hw).reshape(c, -1).T
    softplus = torch.log1p(module.scale[0, 0].exp())
    q, k = q / softplus, k / softplus
    m = k.shape[1]
    outputs = []
    for b in range(x.shape[0]):
        per_head = []
        for h in range(heads):
            block = slice(h * d, (h + 1) * d)
            p = 1 + module.alpha * torch.sigmoid(module.power[0, h, 0])
            q_h, k_h, v_h = q[b, :, block], k[b, :, block], v[b, :, block]
            q_pos, q_neg = q_h.clamp(min=0) ** p, (-q_h).clamp(min=0) ** p
            k_pos, k_neg = k_h.clamp(min=0) ** p, (-k_h).clamp(min=0) ** p
            same = q_pos @ k_pos.T + q_neg @ k_neg.T  # [N, M]
            opposite = q_neg @ k_pos.T + q_pos @ k_neg.T
            halves = [
                (sim @ half / m) / (sim.sum(-1, keepdim=True) / m + eps)
                for sim, half in ((same, v_h[:, : d // 2]), (opposite, v_h[:, d // 2 :]))
            ]
            image = upsampled_images(v_h, key_hw, hw)
            local = depthwise_conv(image, module.dwc.weight, module.dwc.bias).reshape(d, -1).T
            per_head.append(torch.cat(halves, dim=-1) + local)
        outputs.append(torch.cat(per_head, dim=-1))
    return (torch.stack(outputs) * gate) @ module.proj.weight.T + module.proj.bias


REFERENCES = {"agent": agent_reference, "pola": pola_reference}


def randomised(name: str, options: dict[str, Any]) -> torch.nn.Module:
    """A float64 module in eval mode with every parameter moved off its init (zero biases, powers)."""
    torch.manual_seed(0)
    module = build_attention(name, 16, 2, **options).double().eval()
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    return module


@pytest.mark.parametrize(
    ("name", "options", "hw"),
    [
        ("agent", {"agent_num": 9, "bias_size": 6}, (6, 6)),  # at the bias base size: stored biases
        ("agent", {"agent_num": 9, "bias_size": 6}, (7, 11)),  # non-square, resampled, overlapping pools
        ("agent", {"agent_num": 4, "bias_size": 8, "sr_ratio": 2, "kernel_size": 5}, (8, 10)),
        ("pola", {"position_encoding": "learned", "position_size": 6}, (6, 6)),
        ("pola", {"position_encoding": "learned", "position_size": 6}, (7, 11)),
        ("pola", {"alpha": 2.0, "kernel_size": 3, "sr_ratio": 2}, (8, 10)),
        # odd grids: the stride-2 conv drops the last row and column, V is upsampled back to 9×11
        ("agent", {"agent_num": 4, "bias_size": 8, "sr_ratio": 2}, (9, 11)),
        ("pola", {"position_encoding": "learned", "position_size": 8, "sr_ratio": 2}, (9, 11)),
    ],
)
def test_module_equals_explicit_quadratic_formula_with_gradients(
    name: str, options: dict[str, Any], hw: tuple[int, int]
) -> None:
    module = randomised(name, options)
    x = torch.randn(2, hw[0] * hw[1], 16, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(2, hw[0] * hw[1], 16, dtype=torch.float64)
    inputs = [x, *module.parameters()]
    out, expected = module(x, hw), REFERENCES[name](module, x, hw)
    assert (out - expected).abs().max() <= 1e-10 * expected.abs().max()
    grads = torch.autograd.grad((out * upstream).sum(), inputs)
    expected_grads = torch.autograd.grad((expected * upstream).sum(), inputs)
    for grad, want in zip(grads, expected_grads, strict=True):
        assert (grad - want).abs().max() <= 1e-9 * want.abs().max() + 1e-12


def test_functions_gradcheck() -> None:
    torch.manual_seed(0)
    hw = (3, 5)
    q, k, v = (torch.randn(1, 2, 15, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    agent_bias = torch.randn(2, 4, 15, dtype=torch.float64, requires_grad=True)
    query_bias = torch.randn(2, 15, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda *t: agent_attention(*t[:3], hw, *t[3:], 4), (q, k, v, agent_bias, query_bias)
    )
    power = (2 + torch.rand(2, 1, 4, dtype=torch.float64)).requires_grad_()  # p ≥ 2: smooth at 0
    with torch.no_grad():
        q[..., 0] = 0.0  # a zero channel: |x|^p and both its derivatives vanish there
    assert torch.autograd.gradcheck(pola_attention, (q, k, v, power))  # eager: the feature map's Function


def test_pooling_matrix_equals_adaptive_avg_pool() -> None:
    x = torch.randn(1, 3, 7, 11, dtype=torch.float64)
    for side in (2, 3, 8):  # fewer, overlapping and more windows than rows
        rows = adaptive_pooling_matrix(7, side, x)
        cols = adaptive_pooling_matrix(11, side, x)
        expected = torch.nn.functional.adaptive_avg_pool2d(x, side)
        assert (rows @ x @ cols.T - expected).abs().max() <= 1e-12


def test_resample_grid_is_bilinear_interpolation_and_the_identity_at_its_size() -> None:
    maps = torch.randn(2, 3, 7, 5, dtype=torch.float64)
    assert torch.equal(resample_grid(maps, (7, 5)), maps)
    for size in [(16, 9), (3, 2), (7, 12)]:  # up, down, mixed
        expected = torch.nn.functional.interpolate(maps, size=size, mode="bilinear", align_corners=False)
        assert (resample_grid(maps, size) - expected).abs().max() <= 1e-12


def test_segment_pooling_takes_any_agent_count() -> None:
    module = build_attention("agent", 16, 2, agent_num=5, pooling="segments")
    assert module(torch.randn(1, 7 * 9, 16), (7, 9)).shape == (1, 63, 16)


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("agent", {"agent_num": 10}, r"agent_num=10.*perfect square"),
        ("agent", {"pooling": "max"}, r"pooling='max'.*grid.*segments"),
        ("agent", {"kernel_size": 4}, r"kernel_size=4.*odd"),
        ("pola", {"alpha": 0.0}, r"alpha=0\.0.*> 0"),
        ("pola", {"alpha": -1.0}, r"alpha=-1\.0.*> 0"),
        ("pola", {"kernel_size": 2}, r"kernel_size=2.*odd"),
        ("pola", {"position_encoding": "sine"}, r"position_encoding='sine'.*none.*learned"),
    ],
)
def test_bad_options_fail_with_one_clear_error(name: str, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        build_attention(name, 16, 2, **options)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", ["agent", "pola"])
def test_config_builds_and_flags(name: str) -> None:
    cfg = OmegaConf.load(CONF / f"{name}.yaml")
    assert cfg.name == name
    module = build_attention(name, 32, 2, **OmegaConf.to_container(cfg.options))
    assert module(torch.randn(1, 9 * 7, 32), (9, 7)).shape == (1, 63, 32)
    cls = attention_class(name)
    assert (cls.onnx_dynamic, cls.quadratic) == (True, False)


def test_pvt_reduces_only_quadratic_variants_by_default() -> None:
    """model=pvt: softmax keeps PVTv2's sr_ratios, agent and pola attend at full resolution (as the
    released Agent-PVT and PolaFormer-PVT) unless model.linear_sr_ratios is given (the official
    la_sr_ratios); model.sr_ratios is the quadratic variants' only."""

    def ratios(attention: str, **options: Any) -> list[int]:
        model = build_model("pvt", num_classes=2, attention=attention, embed_dims=[8, 16, 40, 64], **options)
        return [stage.blocks[0].attn.sr_ratio for stage in model.encoder.stages]

    assert ratios("softmax") == [8, 4, 2, 1]
    assert ratios("agent") == ratios("pola") == [1, 1, 1, 1]
    assert ratios("agent", linear_sr_ratios=[4, 2, 1, 1]) == [4, 2, 1, 1]
    assert ratios("pola", sr_ratios=[4, 2, 1, 1]) == [1, 1, 1, 1]
    assert ratios("flatten") == [1, 1, 1, 1]  # saved flatten configs carry sr_ratios: [8, 4, 2, 1]
    assert ratios("flatten", sr_ratios=[8, 4, 2, 1]) == [1, 1, 1, 1]
