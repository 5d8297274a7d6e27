"""Mix-FFN's depthwise 3×3 conv + GELU as one Triton operator (``segattn::depthwise_conv_gelu``): outputs and
the gradients of input, weight and bias against conv2d(groups=C) + exact GELU in float64, ``opcheck`` on
both operators, and ``MixFFN`` taking it under SEGATTN_KERNEL=triton with its parameters unchanged, in eager
mode and compiled, but not when exported.

On the CPU through Triton's interpreter (tests/conftest.py); with a CUDA device, compiled. Sizes are tiny
and odd (the interpreter runs programs one by one)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor
from torch._dynamo.testing import CompileCounterWithBackend
from torch.utils._python_dispatch import TorchDispatchMode

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from segattn.layers import KERNEL_ENV, depthwise_triton  # noqa: F401  (registers the operators)
from segattn.models.blocks import MixFFN

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
HEIGHT, WIDTH = 9, 11  # 2 interpreter tiles of 64 pixels an image, split mid-row; 2 ĝ programs walk 2 each
SMALL = (3, 4)  # one tile: for the tests of the operator's plumbing, which run it many times


def inputs(
    dtype: torch.dtype, channels: int = 20, batch: int = 2, hw: tuple[int, int] = (HEIGHT, WIDTH)
) -> tuple[Tensor, Tensor, Tensor]:
    """Tokens [B, H·W, C] as a strided view (every other channel of a wider tensor), weight and bias."""
    generator = torch.Generator().manual_seed(0)
    wide = torch.randn(batch, hw[0] * hw[1], 2 * channels, generator=generator)
    weight = torch.randn(channels, 1, 3, 3, generator=generator)
    bias = torch.randn(channels, generator=generator)
    x = wide.to(DEVICE, dtype).requires_grad_()[..., ::2]
    return x, weight.to(DEVICE).requires_grad_(), bias.to(DEVICE).requires_grad_()


def explicit(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """GELU(conv2d(x on the grid, groups=C) + bias) as tokens."""
    images = x.transpose(1, 2).unflatten(-1, (HEIGHT, WIDTH))
    return F.gelu(F.conv2d(images, weight, bias, padding=1, groups=x.shape[-1])).flatten(2).transpose(1, 2)


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_conv_gelu_operator_matches_the_explicit_formula_with_its_gradients(
    dtype: torch.dtype, tolerance: float
) -> None:
    x, weight, bias = inputs(dtype)
    out = torch.ops.segattn.depthwise_conv_gelu(x, weight, bias, HEIGHT, WIDTH)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE, dtype)
    grads = torch.autograd.grad(out, (x, weight, bias), grad)
    exact = [t.detach().double().requires_grad_() for t in (x, weight, bias)]
    reference = explicit(*exact)
    reference_grads = torch.autograd.grad(reference, exact, grad.double())
    assert out.dtype == dtype and out.is_contiguous()
    for got, want in zip((out, *grads), (reference, *reference_grads), strict=True):
        scale = want.abs().max().item()
        torch.testing.assert_close(got.double(), want, rtol=0, atol=tolerance * scale)


def test_conv_gelu_backward_is_deterministic() -> None:
    """The weight and bias gradients are per-program partials summed in a fixed order, never atomics: two
    backward passes agree bit for bit."""
    x, weight, bias = inputs(torch.float32)
    grad = torch.randn(x.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    args = (grad, x.detach(), weight.detach(), bias.detach(), HEIGHT, WIDTH)
    first, second = (torch.ops.segattn.depthwise_conv_gelu_backward(*args) for _ in range(2))
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


def test_conv_gelu_operators_pass_opcheck() -> None:
    x, weight, bias = inputs(torch.float32, channels=8, batch=2, hw=SMALL)
    args = (x, weight, bias, *SMALL)
    checks = dict(torch.library.opcheck(torch.ops.segattn.depthwise_conv_gelu.default, args))
    grad = torch.randn(x.shape, device=DEVICE)
    backward = (grad, x.detach(), weight.detach(), bias.detach(), *SMALL)
    checks |= {
        f"backward {test}": result
        for test, result in torch.library.opcheck(
            torch.ops.segattn.depthwise_conv_gelu_backward.default, backward
        ).items()
    }
    assert {test: result for test, result in checks.items() if result != "SUCCESS"} == {}


class OperatorNames(TorchDispatchMode):
    """Records the name of every operator dispatched inside."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


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
    assert "segattn.depthwise_conv_gelu.default" in names.names
    assert "segattn.depthwise_conv_gelu_backward.default" in names.names
    assert not any("convolution" in name or "gelu" in name for name in names.names if "segattn" not in name)
    expected = plain(x, SMALL)
    expected.sum().backward()
    torch.testing.assert_close(out, expected)
    for got, want in zip(fused.parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(got.grad, want.grad)


def test_compiled_mix_ffn_keeps_the_operator_in_one_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """``torch.compile`` (AOT autograd) of a MixFFN built under SEGATTN_KERNEL=triton: one graph holding the
    operator, with eager mode's outputs and gradients."""
    monkeypatch.setenv(KERNEL_ENV, "triton")
    module = MixFFN(8, 16).to(DEVICE)
    x = torch.randn(2, SMALL[0] * SMALL[1], 8, device=DEVICE, requires_grad=True)
    out = module(x, SMALL)
    grads = torch.autograd.grad(out.sum(), [x, *module.parameters()])
    counter = CompileCounterWithBackend("aot_eager")
    compiled_out = torch.compile(module, backend=counter)(x, SMALL)
    compiled_grads = torch.autograd.grad(compiled_out.sum(), [x, *module.parameters()])
    assert counter.frame_count == 1
    targets = [str(node.target) for node in counter.graphs[0].graph.nodes if node.op == "call_function"]
    assert [target for target in targets if target.startswith("segattn.")] == [
        "segattn.depthwise_conv_gelu.default"
    ]
    for actual, expected in zip([compiled_out, *compiled_grads], [out, *grads], strict=True):
        torch.testing.assert_close(actual, expected)


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
