"""Mix-FFN after fc1's matmul as Triton operators (the opt-in ``ffn`` form, ``layers.mix_ffn_triton``): the
output and the gradients of the tokens and every parameter against fc1, conv2d(groups=C), exact GELU and fc2
in float64, fp32 and bf16 autocast, over more than one block of hidden channels; ``opcheck`` on its four
operators; deterministic backward; ``MixFFN`` taking it under SEGATTN_KERNEL=ffn with its parameters
unchanged, equal to the PyTorch path, and compiled into one graph.

On the CPU through Triton's interpreter (tests/conftest.py); with a CUDA device, compiled. Sizes are tiny
and odd (the interpreter runs programs one by one)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from operator_names import OperatorNames, compiled_segattn_targets

from segattn.layers import KERNEL_ENV
from segattn.layers.mix_ffn_triton import MixFFNFunction
from segattn.models.blocks import Block, MixFFN

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
HEIGHT, WIDTH = 5, 7  # an interpreter tile of 64 pixels holds one image; its last rows lie past the grid
SMALL = (3, 4)


def inputs(channels: int = 12, hidden: int = 40, batch: int = 2, hw: tuple[int, int] = (HEIGHT, WIDTH)):
    """Tokens [B, H·W, C] and fc1's, the conv's and fc2's weights and biases, fp32, requiring grad."""
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randn(batch, hw[0] * hw[1], channels, generator=generator)
    shapes = [(hidden, channels), (hidden,), (hidden, 1, 3, 3), (hidden,), (channels, hidden), (channels,)]
    parameters = [0.3 * torch.randn(shape, generator=generator) for shape in shapes]
    return [t.to(DEVICE).requires_grad_() for t in (tokens, *parameters)]


def explicit(
    tokens: Tensor, w1: Tensor, b1: Tensor, cw: Tensor, cb: Tensor, w2: Tensor, b2: Tensor
) -> Tensor:
    """fc2(GELU(conv2d(fc1(tokens) on the grid, zero-padded, groups=hidden))) as tokens."""
    images = F.linear(tokens, w1, b1).transpose(1, 2).unflatten(-1, (HEIGHT, WIDTH))
    activation = F.gelu(F.conv2d(images, cw, cb, padding=1, groups=w1.shape[0])).flatten(2).transpose(1, 2)
    return F.linear(activation, w2, b2)


@pytest.mark.parametrize(
    ("dtype", "hidden", "tolerance"),
    [(torch.float32, 40, 1e-5), (torch.float32, 300, 1e-5), (torch.bfloat16, 40, 3e-2)],
)
def test_mix_ffn_operators_match_the_explicit_formula_with_every_gradient(
    dtype: torch.dtype, hidden: int, tolerance: float
) -> None:
    """300 hidden channels: two blocks of them under the interpreter (256 a program)."""
    tensors = inputs(hidden=hidden)
    with torch.autocast(DEVICE.type, dtype=dtype, enabled=dtype != torch.float32):
        out = MixFFNFunction.apply(*tensors, HEIGHT, WIDTH)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE, dtype)
    grads = torch.autograd.grad(out, tensors, grad)
    exact = [t.detach().double().requires_grad_() for t in tensors]
    reference = explicit(*exact)
    reference_grads = torch.autograd.grad(reference, exact, grad.double())
    assert out.dtype == dtype and out.is_contiguous()
    assert [g.dtype for g in grads] == [t.dtype for t in tensors]
    for got, want in zip((out, *grads), (reference, *reference_grads), strict=True):
        scale = want.abs().max().item()
        torch.testing.assert_close(got.double(), want, rtol=0, atol=tolerance * scale)


def test_mix_ffn_backward_is_deterministic() -> None:
    """Every parameter's gradient is per-program partials summed in a fixed order, never atomics: two
    backward passes agree bit for bit."""
    tensors = inputs()
    out = MixFFNFunction.apply(*tensors, HEIGHT, WIDTH)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    first, second = (torch.autograd.grad(out, tensors, grad, retain_graph=True) for _ in range(2))
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


def test_mix_ffn_operators_pass_opcheck() -> None:
    tokens, w1, b1, cw, cb, w2, b2 = (t.detach() for t in inputs(channels=8, hidden=16, hw=SMALL))
    hidden = F.linear(tokens, w1)
    grad = torch.randn(tokens.shape, device=DEVICE)
    grad_pre = torch.randn(hidden.shape, device=DEVICE)
    ops = torch.ops.segattn
    cases = {
        ops.mix_ffn.default: (hidden, b1, cw, cb, w2, b2, *SMALL),
        ops.mix_ffn_gelu_backward.default: (grad, hidden, b1, cw, cb, w2, *SMALL),
        ops.mix_ffn_input_grad.default: (grad_pre, cw, w1, *SMALL),
        ops.mix_ffn_fc1_grad.default: (grad_pre, tokens, cw, *SMALL),
    }
    checks = {}
    for op, args in cases.items():
        checks |= {f"{op} {test}": result for test, result in torch.library.opcheck(op, args).items()}
    assert {test: result for test, result in checks.items() if result != "SUCCESS"} == {}


def test_mix_ffn_takes_the_operators_under_ffn_with_its_parameters_unchanged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under SEGATTN_KERNEL=ffn (on the CPU, the interpreter's rule: tensors on a CUDA device take it under
    ``ffn`` alone) a MixFFN runs fc1's matmul and the four operators, no convolution, GELU or fc2 of its
    own, and equals the PyTorch path in output and every gradient."""
    monkeypatch.setenv(KERNEL_ENV, "torch")
    plain = MixFFN(8, 16).to(DEVICE)
    monkeypatch.setenv(KERNEL_ENV, "ffn" if DEVICE.type == "cuda" else "triton")
    fused = MixFFN(8, 16).to(DEVICE)
    fused.load_state_dict(plain.state_dict())
    x = torch.randn(2, SMALL[0] * SMALL[1], 8, device=DEVICE, requires_grad=True)
    with OperatorNames() as names:
        out = fused(x, SMALL)
        (grad_x,) = torch.autograd.grad(out.sum(), x, retain_graph=True)
        out.sum().backward()
    segattn_ops = {name for name in names.names if name.startswith("segattn.")}
    assert segattn_ops == {
        f"segattn.{op}.default"
        for op in ("mix_ffn", "mix_ffn_gelu_backward", "mix_ffn_input_grad", "mix_ffn_fc1_grad")
    }
    others = [name for name in names.names if not name.startswith("segattn.")]
    assert not any(op in name for name in others for op in ("convolution", "gelu", "addmm"))
    expected = plain(x, SMALL)
    (want_x,) = torch.autograd.grad(expected.sum(), x, retain_graph=True)
    expected.sum().backward()
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(grad_x, want_x)
    for got, want in zip(fused.parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(got.grad, want.grad)


def test_compiled_mix_ffn_form_keeps_its_operator_in_one_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """``torch.compile`` (AOT autograd) of a MixFFN built under SEGATTN_KERNEL=triton: one graph, whose
    autograd Function holds the forward operator and the three backward ones, with eager mode's outputs
    and gradients."""
    monkeypatch.setenv(KERNEL_ENV, "triton")
    module = MixFFN(8, 16).to(DEVICE)
    x = torch.randn(2, SMALL[0] * SMALL[1], 8, device=DEVICE, requires_grad=True)
    assert sorted(compiled_segattn_targets(module, x, SMALL)) == [
        f"segattn.{op}.default"
        for op in ("mix_ffn", "mix_ffn_fc1_grad", "mix_ffn_gelu_backward", "mix_ffn_input_grad")
    ]


def test_tokens_that_need_no_gradient_get_no_input_gradient_launch() -> None:
    tokens, *parameters = inputs()
    with OperatorNames() as names:
        MixFFNFunction.apply(tokens.detach(), *parameters, HEIGHT, WIDTH).sum().backward()
    assert "segattn.mix_ffn_fc1_grad.default" in names.names
    assert "segattn.mix_ffn_input_grad.default" not in names.names
    assert all(p.grad is not None for p in parameters)


class Halving(torch.nn.Module):
    """An attention stand-in for a block: x / 2."""

    def forward(self, x: Tensor, hw: tuple[int, int]) -> Tensor:
        return x / 2


@pytest.mark.parametrize("init_values", [None, 0.5])
def test_a_checkpointed_block_runs_the_forward_operator_only_where_its_output_is_read(
    monkeypatch: pytest.MonkeyPatch, init_values: float | None
) -> None:
    """Recomputed in backward, a block's Mix-FFN saves what its backward needs without running ``mix_ffn``,
    whose output only the block's return reads, and backward discards that; with LayerScale, which keeps
    the output for its own gradient, it runs again. The gradients equal the block's without checkpointing
    either way."""
    monkeypatch.setenv(KERNEL_ENV, "ffn" if DEVICE.type == "cuda" else "triton")
    torch.manual_seed(0)
    block = Block(8, Halving(), MixFFN(8, 16), init_values=init_values).to(DEVICE)
    x = torch.randn(2, SMALL[0] * SMALL[1], 8, device=DEVICE, requires_grad=True)
    inputs = [x, *block.parameters()]
    expected = torch.autograd.grad(block(x, SMALL).square().sum(), inputs)
    block.grad_checkpointing = True
    with OperatorNames() as names:
        got = torch.autograd.grad(block(x, SMALL).square().sum(), inputs)
    assert names.names.count("segattn.mix_ffn.default") == (1 if init_values is None else 2)
    for actual, wanted in zip(got, expected, strict=True):
        torch.testing.assert_close(actual, wanted)
