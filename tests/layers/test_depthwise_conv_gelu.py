"""Mix-FFN's fc1 bias + depthwise 3×3 conv + GELU as one Triton operator (``segattn::depthwise_conv_gelu``):
outputs and the gradients of input, input bias, weight and bias against conv2d(groups=C) + exact GELU in
float64, ``opcheck`` on the operator and its two backward operators, and ``MixFFN`` taking it under
SEGATTN_KERNEL=triton with its parameters unchanged, in eager mode and compiled, but not when exported.

On the CPU through Triton's interpreter (tests/conftest.py); with a CUDA device, compiled. Sizes are tiny
and odd (the interpreter runs programs one by one)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F
from operator_names import OperatorNames, compiled_segattn_targets
from torch import Tensor

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from segattn.layers import KERNEL_ENV, depthwise, depthwise_triton  # noqa: F401  (registers the operators)
from segattn.models.blocks import MixFFN

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
HEIGHT, WIDTH = 9, 11  # 2 interpreter tiles of 64 pixels an image, split mid-row; 2 ĝ programs walk 2 each
SMALL = (3, 4)  # one tile: for the tests of the operator's plumbing, which run it many times


def inputs(
    dtype: torch.dtype, channels: int = 20, batch: int = 2, hw: tuple[int, int] = (HEIGHT, WIDTH)
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Tokens [B, H·W, C] as a strided view (every other channel of a wider tensor), input bias, weight and
    bias."""
    generator = torch.Generator().manual_seed(0)
    wide = torch.randn(batch, hw[0] * hw[1], 2 * channels, generator=generator)
    input_bias = torch.randn(channels, generator=generator)
    weight = torch.randn(channels, 1, 3, 3, generator=generator)
    bias = torch.randn(channels, generator=generator)
    x = wide.to(DEVICE, dtype).requires_grad_()[..., ::2]
    return x, *(t.to(DEVICE).requires_grad_() for t in (input_bias, weight, bias))


def explicit(x: Tensor, input_bias: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """GELU(conv2d(x + input_bias on the grid, zero-padded, groups=C) + bias) as tokens."""
    images = (x + input_bias).transpose(1, 2).unflatten(-1, (HEIGHT, WIDTH))
    return F.gelu(F.conv2d(images, weight, bias, padding=1, groups=x.shape[-1])).flatten(2).transpose(1, 2)


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_conv_gelu_operator_matches_the_explicit_formula_with_its_gradients(
    dtype: torch.dtype, tolerance: float
) -> None:
    tensors = inputs(dtype)
    out = torch.ops.segattn.depthwise_conv_gelu(*tensors, HEIGHT, WIDTH)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE, dtype)
    grads = torch.autograd.grad(out, tensors, grad)
    exact = [t.detach().double().requires_grad_() for t in tensors]
    reference = explicit(*exact)
    reference_grads = torch.autograd.grad(reference, exact, grad.double())
    assert out.dtype == dtype and out.is_contiguous()
    for got, want in zip((out, *grads), (reference, *reference_grads), strict=True):
        scale = want.abs().max().item()
        torch.testing.assert_close(got.double(), want, rtol=0, atol=tolerance * scale)


def test_conv_gelu_backward_is_deterministic() -> None:
    """The weight and bias gradients are per-program partials summed in a fixed order, never atomics: two
    backward passes agree bit for bit."""
    tensors = inputs(torch.float32)
    out = torch.ops.segattn.depthwise_conv_gelu(*tensors, HEIGHT, WIDTH)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    first, second = (torch.autograd.grad(out, tensors, grad, retain_graph=True) for _ in range(2))
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


def test_conv_gelu_operators_pass_opcheck() -> None:
    tensors = inputs(torch.float32, channels=8, batch=2, hw=SMALL)
    ops = torch.ops.segattn
    checks = dict(torch.library.opcheck(ops.depthwise_conv_gelu.default, (*tensors, *SMALL)))
    grad = torch.randn(tensors[0].shape, device=DEVICE)
    x, input_bias, weight, bias = (t.detach() for t in tensors)
    backward = {
        ops.depthwise_gelu_backward.default: (grad, x, input_bias, weight, bias, *SMALL),
        ops.depthwise_conv_input_grad.default: (grad, weight, *SMALL),
    }
    for op, args in backward.items():
        checks |= {f"{op} {test}": result for test, result in torch.library.opcheck(op, args).items()}
    assert {test: result for test, result in checks.items() if result != "SUCCESS"} == {}


@pytest.fixture
def conv_gelu_form(monkeypatch: pytest.MonkeyPatch) -> None:
    """MixFFN's conv + GELU operator under SEGATTN_KERNEL=triton: the whole-FFN form (test_mix_ffn_triton.py)
    left out by its width limit, as for tokens wider than its operators take."""
    monkeypatch.setattr(depthwise, "MAX_FFN_CHANNELS", 0)


@pytest.mark.usefixtures("conv_gelu_form")
def test_mix_ffn_takes_the_operator_under_triton_with_its_parameters_unchanged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(KERNEL_ENV, "torch")
    plain = MixFFN(8, 16).to(DEVICE)
    monkeypatch.setenv(KERNEL_ENV, "triton")
    fused = MixFFN(8, 16).to(DEVICE)
    fused.load_state_dict(plain.state_dict())
    assert list(fused.state_dict()) == [
        "fc1.weight",
        "fc1.bias",
        "dwconv.weight",
        "dwconv.bias",
        "fc2.weight",
        "fc2.bias",
    ]
    x = torch.randn(2, SMALL[0] * SMALL[1], 8, device=DEVICE)
    with OperatorNames() as names:
        out = fused(x, SMALL)
        out.sum().backward()
    for op in ("depthwise_conv_gelu", "depthwise_gelu_backward", "depthwise_conv_input_grad"):
        assert f"segattn.{op}.default" in names.names
    assert not any("convolution" in name or "gelu" in name for name in names.names if "segattn" not in name)
    assert names.names.count("aten.addmm.default") == 1  # fc2 only: fc1's bias is the operator's
    expected = plain(x, SMALL)
    expected.sum().backward()
    torch.testing.assert_close(out, expected)
    for got, want in zip(fused.parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(got.grad, want.grad)


@pytest.mark.usefixtures("conv_gelu_form")
def test_compiled_mix_ffn_keeps_the_operator_in_one_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """``torch.compile`` (AOT autograd) of a MixFFN built under SEGATTN_KERNEL=triton: one graph holding the
    operator, with eager mode's outputs and gradients."""
    monkeypatch.setenv(KERNEL_ENV, "triton")
    module = MixFFN(8, 16).to(DEVICE)
    x = torch.randn(2, SMALL[0] * SMALL[1], 8, device=DEVICE, requires_grad=True)
    assert compiled_segattn_targets(module, x, SMALL) == ["segattn.depthwise_conv_gelu.default"]


def test_exported_mix_ffn_holds_the_plain_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    """Built under SEGATTN_KERNEL=triton, a MixFFN exports (``torch.export``) to conv2d and GELU, never the
    operator."""
    monkeypatch.setenv(KERNEL_ENV, "triton")
    module = MixFFN(8, 16).to(DEVICE)

    class Grid(torch.nn.Module):
        def forward(self, x: Tensor) -> Tensor:
            return module(x, SMALL)

    x = torch.randn(2, SMALL[0] * SMALL[1], 8, device=DEVICE)
    exported = torch.export.export(Grid(), (x,))
    assert not [node for node in exported.graph.nodes if str(node.target).startswith("segattn.")]
    torch.testing.assert_close(exported.module()(x), module(x, SMALL))
