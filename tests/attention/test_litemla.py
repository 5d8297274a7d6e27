"""LiteMLA (EfficientViT, Cai et al. 2023): its options against the paper's formula (``litemla_reference``),
timm's own LiteMLA, and the errors for options it cannot take. The default configuration also runs in the
shared zoo tests (``KNOWN_VARIANTS``): quadratic form, gradcheck, bf16 at 16k tokens, no N×N tensor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from attention_reference import linear_weights, litemla_reference
from omegaconf import OmegaConf
from timm.models.efficientvit_mit import LiteMLA

from segattn.attention import attention_class, build_attention, lite_linear_attention
from segattn.layers import from_grid, to_grid

CONF = Path(__file__).resolve().parents[2] / "conf" / "attention"


def perturbed(module: torch.nn.Module) -> torch.nn.Module:
    """Every parameter and BatchNorm statistic moved off its init, float64, eval mode (running stats)."""
    torch.manual_seed(0)
    module = module.double().eval()
    with torch.no_grad():
        for tensor in [*module.parameters(), module.proj[1].running_mean]:
            tensor.add_(0.3 * torch.randn_like(tensor))
        module.proj[1].running_var.uniform_(0.5, 2.0)
    return module


def test_config_builds_with_its_flags() -> None:
    cfg = OmegaConf.load(CONF / "litemla.yaml")
    module = build_attention(cfg.name, 32, 2, **OmegaConf.to_container(cfg.options))
    assert (module.num_heads, module.head_dim, module.scales) == (2, 16, [5])
    cls = attention_class("litemla")
    assert (cls.onnx_dynamic, cls.quadratic) == (True, False)


@pytest.mark.parametrize("hw", [(8, 8), (12, 20), (5, 3)])
def test_two_scales_and_head_dim_equal_the_paper_in_eval(hw: tuple[int, int]) -> None:
    """scales [3, 5] (three sets of heads), head_dim overriding num_heads, running BatchNorm statistics; the
    same weights at every grid."""
    module = perturbed(build_attention("litemla", 16, 1, scales=[3, 5], head_dim=4))
    assert module.num_heads == 4 and len(module.aggreg) == 2
    x = torch.randn(2, hw[0] * hw[1], 16, dtype=torch.float64)
    expected = litemla_reference(module, x, hw)
    assert (module(x, hw) - expected).abs().max() <= 1e-10 * expected.abs().max()


def test_module_gradcheck() -> None:
    module = perturbed(build_attention("litemla", 8, 2, scales=[3]))
    x = torch.randn(1, 4 * 3, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: module(t, (4, 3)), (x,))


def test_elu_kernel_equals_its_quadratic_form() -> None:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 40, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    expected = linear_weights(q, k, "elu", eps=1e-5) @ v
    assert (lite_linear_attention(q, k, v, kernel="elu") - expected).abs().max() <= 1e-10


def test_equals_timm_litemla() -> None:
    """timm's LiteMLA (1×1 convs on NCHW, per-head q/k/v channel order) with its weights converted: the same
    function, float32."""
    torch.manual_seed(0)
    timm_module = LiteMLA(32, 32, dim=8, scales=(3, 5), norm_layer=(None, torch.nn.BatchNorm2d)).eval()
    module = build_attention("litemla", 32, 4, scales=[3, 5]).eval()
    with torch.no_grad():
        for tensor in [*timm_module.parameters(), timm_module.proj.norm.running_mean]:
            tensor.normal_()
    module.load_state_dict(
        module.convert_timm_state_dict(timm_module.state_dict())
    )  # strict: same parameters
    x = torch.randn(2, 32, 6, 10)
    with torch.no_grad():
        expected = timm_module(x)
        out = to_grid(module(from_grid(x), (6, 10)), (6, 10))
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"scales": [4]}, r"scales=\[4\] has \[4\]; expected odd kernel sizes"),
        ({"scales": [5, 0]}, r"scales=\[5, 0\] has \[0\]; expected odd kernel sizes"),
        ({"head_dim": 12}, r"head_dim=12 does not divide dim=32"),
        ({"kernel": "softmax"}, r"kernel='softmax'; expected one of \('relu', 'elu'\)"),
    ],
)
def test_bad_option_names_it(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_attention("litemla", 32, 2, **options)
