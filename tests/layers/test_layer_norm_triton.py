"""LayerNorm as one Triton operator (``segattn::layer_norm``): output and the gradients of input, weight and
bias against F.layer_norm in float64 (fp32 and bf16; rows that cross the tile, channels not a power of two),
its output dtype under autocast, ``opcheck`` on both operators, determinism, and ``layers.LayerNorm``
taking it under SEGATTN_KERNEL=triton only, with nn.LayerNorm's parameters, in eager mode and compiled,
but not when exported. ``segattn::residual_layer_norm`` (a block's residual add with stochastic depth's
factor per image, then the norm) against the float64 formula with every gradient, opcheck and determinism,
and a Block on it under SEGATTN_KERNEL=residual equal to the Block on the PyTorch path, as are blocks that
leave their last add to the norm after them (``run_blocks``).

On the CPU through Triton's interpreter (tests/conftest.py); with a CUDA device, compiled."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F
from operator_names import OperatorNames
from torch import Tensor
from torch._dynamo.testing import CompileCounterWithBackend

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from segattn.layers import KERNEL_ENV, LayerNorm, layer_norm_triton  # noqa: F401  (registers the operators)
from segattn.layers.fast_path import paths_of_a_gpu
from segattn.models.blocks import Block, TokenMlp, run_blocks

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
EPS = 1e-6


def inputs(dtype: torch.dtype, rows: int, channels: int) -> tuple[Tensor, Tensor, Tensor]:
    """x [2, rows, C] (a strided view: every other row of a wider tensor), weight and bias."""
    generator = torch.Generator().manual_seed(0)
    wide = 3 * torch.randn(2, 2 * rows, channels, generator=generator) + 1
    weight = 1 + torch.randn(channels, generator=generator) / 4
    bias = torch.randn(channels, generator=generator)
    x = wide.to(DEVICE, dtype).requires_grad_()[:, ::2]
    return x, weight.to(DEVICE).requires_grad_(), bias.to(DEVICE).requires_grad_()


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize(("rows", "channels"), [(37, 20), (5, 200)])  # across tiles; a tile of 8 rows
def test_layer_norm_operator_matches_the_formula_with_its_gradients(
    dtype: torch.dtype, tolerance: float, rows: int, channels: int
) -> None:
    x, weight, bias = inputs(dtype, rows, channels)
    out, mean, rstd = torch.ops.segattn.layer_norm(x, weight, bias, EPS, dtype)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE, dtype)
    grads = torch.autograd.grad(out, (x, weight, bias), grad)
    exact = [t.detach().double().requires_grad_() for t in (x, weight, bias)]
    reference = F.layer_norm(exact[0], (channels,), exact[1], exact[2], EPS)
    reference_grads = torch.autograd.grad(reference, exact, grad.double())
    assert out.dtype == dtype and grads[0].dtype == dtype and mean.dtype == rstd.dtype == torch.float32
    torch.testing.assert_close(mean.double(), exact[0].mean(-1).flatten(), rtol=0, atol=tolerance)
    for got, want in zip((out, *grads), (reference, *reference_grads), strict=True):
        scale = want.abs().max().item()
        torch.testing.assert_close(got.double(), want, rtol=0, atol=tolerance * scale)


def test_the_output_takes_the_dtype_asked_for_and_the_gradient_the_inputs() -> None:
    """fp32 rows normalised into bf16 (what autocast's next matmul reads): the fp32 result rounded once."""
    x, weight, bias = inputs(torch.float32, 9, 12)
    out = torch.ops.segattn.layer_norm(x, weight, bias, EPS, torch.bfloat16)[0]
    expected = F.layer_norm(x, (12,), weight, bias, EPS)
    assert out.dtype == torch.bfloat16
    # within one bf16 step of the fp32 result (the interpreter truncates where a GPU rounds)
    torch.testing.assert_close(out.float(), expected, rtol=2**-7, atol=1e-6)
    (grad_x,) = torch.autograd.grad(out.float().sum(), x)
    assert grad_x.dtype == torch.float32


def test_layer_norm_operators_pass_opcheck_and_backward_is_deterministic() -> None:
    x, weight, bias = inputs(torch.float32, 11, 12)
    checks = dict(
        torch.library.opcheck(torch.ops.segattn.layer_norm.default, (x, weight, bias, EPS, torch.float32))
    )
    _, mean, rstd = torch.ops.segattn.layer_norm(x, weight, bias, EPS, torch.float32)
    grad = torch.randn(x.shape, device=DEVICE)
    backward = (grad, x.detach(), weight.detach(), mean.detach(), rstd.detach())
    checks |= {
        f"backward {test}": result
        for test, result in torch.library.opcheck(
            torch.ops.segattn.layer_norm_backward.default, backward
        ).items()
    }
    assert {test: result for test, result in checks.items() if result != "SUCCESS"} == {}
    first, second = (torch.ops.segattn.layer_norm_backward(*backward) for _ in range(2))
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


def test_layer_norm_module_takes_the_operator_by_the_kernel_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU's default (``auto``) and SEGATTN_KERNEL=triton run the operator, with nn.LayerNorm's state_dict
    and values; ``torch`` keeps PyTorch's layer_norm; exported, the plain op."""
    for kernel, takes in [("auto", True), ("torch", False)]:
        monkeypatch.setenv(KERNEL_ENV, kernel)
        with paths_of_a_gpu():
            assert LayerNorm(8).takes_triton(torch.zeros(1, 8)) == takes, kernel
    monkeypatch.setenv(KERNEL_ENV, "triton")
    norm = LayerNorm(8, eps=EPS).to(DEVICE)
    reference = torch.nn.LayerNorm(8, eps=EPS).to(DEVICE)
    with torch.no_grad():
        reference.weight.normal_()
        reference.bias.normal_()
    norm.load_state_dict(reference.state_dict())
    x = torch.randn(2, 5, 8, device=DEVICE)
    assert norm.takes_triton(x)
    torch.testing.assert_close(norm(x), reference(x))
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(norm, backend=counter, fullgraph=True)
    torch.testing.assert_close(compiled(x), reference(x))
    assert counter.frame_count == 1
    exported = torch.export.export(norm, (x,))
    assert "segattn" not in str(exported.graph)


def test_under_autocast_only_a_norm_feeding_a_matmul_writes_the_autocast_dtype() -> None:
    """A block's pre-norm writes what its matmul reads (bf16); a norm that starts a residual stream keeps
    autocast's own LayerNorm dtype (the input's on the CPU, fp32 on CUDA); outside autocast, the input's."""
    x = torch.zeros(2, 8, device=DEVICE)
    autocasts_own = torch.float32 if DEVICE.type == "cuda" else torch.bfloat16  # for a bf16 input
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        assert LayerNorm(8, feeds_matmul=True).out_dtype(x) == torch.bfloat16
        assert LayerNorm(8).out_dtype(x.bfloat16()) == autocasts_own
    assert LayerNorm(8, feeds_matmul=True).out_dtype(x) == torch.float32


def residual_inputs(
    dtype: torch.dtype, branch_dtype: torch.dtype, scaled: bool
) -> tuple[Tensor, Tensor, Tensor | None, Tensor, Tensor]:
    """x and the branch [2 images, 37 tokens, 20] (74 rows: across tiles and images), stochastic depth's
    factor per image (one image dropped) or None, weight and bias."""
    x, weight, bias = inputs(dtype, 37, 20)
    branch = torch.randn(x.shape, generator=torch.Generator().manual_seed(2)).to(DEVICE, branch_dtype)
    scale = torch.tensor([0.0, 1.25], device=DEVICE) if scaled else None
    return x, branch.requires_grad_(), scale, weight, bias


@pytest.mark.parametrize(
    ("dtype", "branch_dtype"),
    [
        (torch.float32, torch.float32),
        (torch.float32, torch.bfloat16),  # autocast's: an fp32 stream, a bf16 branch
        (torch.bfloat16, torch.bfloat16),
    ],
)
@pytest.mark.parametrize("scaled", [True, False])
@pytest.mark.parametrize("sum_used", [True, False])
def test_residual_layer_norm_operator_matches_the_formula_with_its_gradients(
    dtype: torch.dtype, branch_dtype: torch.dtype, scaled: bool, sum_used: bool
) -> None:
    """s = x + branch·scale[image] in x's dtype and LayerNorm(s) in bf16; ∂x, ∂branch (its dtype), ∂weight,
    ∂bias from y's gradient, and s's where s is used (else autograd gives the operator None for it)."""
    x, branch, scale, weight, bias = residual_inputs(dtype, branch_dtype, scaled)
    summed, out, _, _ = torch.ops.segattn.residual_layer_norm(
        x, branch, scale, weight, bias, EPS, torch.bfloat16
    )
    generator = torch.Generator().manual_seed(1)
    grad_sum, grad = (torch.randn(t.shape, generator=generator).to(DEVICE, t.dtype) for t in (summed, out))
    outputs, output_grads = ((summed, out), (grad_sum, grad)) if sum_used else ((out,), (grad,))
    grads = torch.autograd.grad(outputs, (x, branch, weight, bias), output_grads)
    exact = [t.detach().double().requires_grad_() for t in (x, branch, weight, bias)]
    factor = 1.0 if scale is None else scale.double()[:, None, None]
    exact_sum = exact[0] + exact[1] * factor
    reference = F.layer_norm(exact_sum, (20,), exact[2], exact[3], EPS)
    references = (exact_sum, reference) if sum_used else (reference,)
    reference_grads = torch.autograd.grad(references, exact, [g.double() for g in output_grads])
    assert (summed.dtype, out.dtype, grads[0].dtype, grads[1].dtype) == (
        dtype,
        torch.bfloat16,
        dtype,
        branch_dtype,
    )
    for got, want in zip((summed, out, *grads), (exact_sum, reference, *reference_grads), strict=True):
        tolerance = 2e-2 if torch.bfloat16 in (dtype, got.dtype) else 1e-5
        torch.testing.assert_close(got.double(), want, rtol=0, atol=tolerance * want.abs().max().item())


def test_residual_layer_norm_operators_pass_opcheck_and_backward_is_deterministic() -> None:
    x, branch, scale, weight, bias = residual_inputs(torch.float32, torch.bfloat16, scaled=True)
    failed = {}
    for scaling in (scale, None):
        args = (x, branch, scaling, weight, bias, EPS, torch.bfloat16)
        checks = torch.library.opcheck(torch.ops.segattn.residual_layer_norm.default, args)
        failed |= {f"{test} {scaling}": result for test, result in checks.items() if result != "SUCCESS"}
    summed, out, mean, rstd = (t.detach() for t in torch.ops.segattn.residual_layer_norm(*args))
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE, out.dtype)
    for grad_sum in (torch.randn_like(summed), None):
        backward = (grad_sum, grad, summed, scale, weight.detach(), mean, rstd, torch.bfloat16)
        checks = torch.library.opcheck(torch.ops.segattn.residual_layer_norm_backward.default, backward)
        failed |= {f"backward {test}": result for test, result in checks.items() if result != "SUCCESS"}
    assert failed == {}
    first, second = (torch.ops.segattn.residual_layer_norm_backward(*backward) for _ in range(2))
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(("checkpointed", "autocast"), [(False, False), (True, False), (False, True)])
def test_a_block_on_the_residual_form_equals_the_pytorch_path_with_its_gradients(
    checkpointed: bool, autocast: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SEGATTN_KERNEL=residual on a GPU's paths: the first residual add, stochastic depth (the same draw
    per image, one of two images dropped at this seed) and norm2 as one operator; the same output and
    gradients as the Block on PyTorch's ops at the same seed, recomputed in backward too, and under autocast
    (a bf16 branch onto the fp32 stream: the factor applied in fp32 rather than bf16)."""
    blocks = {}
    for kernel in ("residual", "torch"):
        monkeypatch.setenv(KERNEL_ENV, kernel)
        torch.manual_seed(0)
        with paths_of_a_gpu():
            blocks[kernel] = Block(16, TokenMlp(16, 32), TokenMlp(16, 32), drop_path=0.5, init_values=0.5)
        blocks[kernel].grad_checkpointing = checkpointed and kernel == "residual"
    x = torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(1)).to(DEVICE).requires_grad_()
    results = []
    for kernel, block in blocks.items():
        block.to(DEVICE)
        torch.manual_seed(5)
        with paths_of_a_gpu(), torch.autocast(DEVICE.type, dtype=torch.bfloat16, enabled=autocast):
            assert block.norm2.takes_triton(x, opt_in="residual") == (kernel == "residual")
            out = block(x, (2, 3))
            grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(DEVICE)
            results.append((out, torch.autograd.grad(out, [x, *block.parameters()], grad)))
    (out, grads), (want, want_grads) = results
    tolerance = 2e-2 if autocast else 1e-5  # bf16's: of the largest value
    for got, expected in zip((out, *grads), (want, *want_grads), strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=tolerance * expected.abs().max().item())


@pytest.mark.parametrize(("checkpointed", "autocast"), [(True, False), (False, True)])
def test_blocks_leave_their_last_add_to_the_next_norm_on_the_residual_form(
    checkpointed: bool, autocast: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run_blocks`` on the residual form: each block's second add, with its stochastic depth, goes into the
    norm after it (the next block's norm1, then the closing norm), so only the first norm1 is a plain
    LayerNorm; the same output and gradients as the blocks and norm on PyTorch's ops at the same seed."""
    stages = {}
    for kernel in ("residual", "torch"):
        monkeypatch.setenv(KERNEL_ENV, kernel)
        torch.manual_seed(0)
        with paths_of_a_gpu():
            blocks = [Block(16, TokenMlp(16, 32), TokenMlp(16, 32), drop_path=0.5) for _ in range(2)]
            stages[kernel] = torch.nn.ModuleList([*blocks, LayerNorm(16)]).to(DEVICE)
        for block in blocks:
            block.grad_checkpointing = checkpointed and kernel == "residual"
    x = torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(1)).to(DEVICE).requires_grad_()
    results = []
    for kernel, stage in stages.items():
        torch.manual_seed(5)
        cast = torch.autocast(DEVICE.type, dtype=torch.bfloat16, enabled=autocast)
        with paths_of_a_gpu(), cast:
            with OperatorNames() as names:  # forward's
                out = run_blocks(stage[:2], x, (2, 3), stage[2])
            grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(DEVICE)
            results.append((out, torch.autograd.grad(out, [x, *stage.parameters()], grad)))
        if kernel == "residual":
            norms = [name for name in names.names if "layer_norm.default" in name]
            assert norms == ["segattn.layer_norm.default", *["segattn.residual_layer_norm.default"] * 4]
    (out, grads), (want, want_grads) = results
    tolerance = 2e-2 if autocast else 1e-5  # bf16's: of the largest value
    for got, expected in zip((out, *grads), (want, *want_grads), strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=tolerance * expected.abs().max().item())
