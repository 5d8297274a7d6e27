"""The Triton kernels (``segattn.attention.triton``) against float64 formulas written here, on the CPU through
Triton's interpreter; with a CUDA device, compiled, on CUDA tensors.

Each case checks the output and the gradients of q, k, v (and of every parameter, for the modules) with
q, k, v strided column blocks of one [B, N, 3C] tensor, B·h = 4. Sizes cover N ∈ {1, 7, 1000, 4099} (not
multiples of the block) and d ∈ {16, 32, 64}, each at least once, not every combination: the interpreter
runs programs one by one. Errors are measured relative to the largest magnitude of the compared tensor.

Tolerances: fp32 1e-5 (measured below 1e-6: summation order); bf16 inputs 2e-2 against the formula on
the same bf16 values (results are rounded to bf16, 3.9e-3 relative, and fp32 sums of rounded terms).

TRITON_INTERPRET=1 comes from tests/conftest.py (it must be set before triton is imported).
"""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch
import torch.nn.functional as F
from attention_reference import build_perturbed, module_reference
from test_agent_pola import pola_reference
from test_triton_ops import record_operators
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from segattn.attention.autograd.kernel import KernelAttention
from segattn.attention.functional import FeatureMap, KernelCore
from segattn.attention.triton import functions, load_kernels
from segattn.attention.triton.functions import heads_view, kernel_attention_triton, polarity_attention_triton
from segattn.attention.triton.launch import Blocks, Tuning, tuned
from segattn.layers import FUSED_ENV, KERNEL_ENV, TRITON, choose_path, fast_path, kernel_backend

KERNELS = load_kernels()

DEVICE = torch.device("cpu" if KERNELS.INTERPRETED else "cuda")
pytestmark = pytest.mark.usefixtures("exact_fp32")  # on a GPU, fp32 matmuls and convolutions without TF32
BATCH, HEADS = 2, 2
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
EPS = 1e-6


@pytest.fixture
def forced(monkeypatch: pytest.MonkeyPatch) -> None:
    """SEGATTN_KERNEL=triton for the modules built in the test."""
    monkeypatch.setenv(KERNEL_ENV, "triton")


def qkv_leaf(tokens: int, d: int, dtype: torch.dtype, seed: int = 0, spread: float = 1.0) -> Tensor:
    """One [B, N, 3C] leaf, C = h·d: q, k, v are its column blocks."""
    generator = torch.Generator().manual_seed(seed)
    qkv = (spread * torch.randn(BATCH, tokens, 3 * HEADS * d, generator=generator)).to(DEVICE, dtype)
    return qkv.requires_grad_()


def column_heads(qkv: Tensor) -> list[Tensor]:
    """q, k, v [B, h, N, d]: head views of the column blocks of a [B, N, 3C] qkv."""
    return [heads_view(x, HEADS) for x in qkv.chunk(3, dim=-1)]


def strided_qkv(tokens: int, d: int, dtype: torch.dtype, seed: int = 0, spread: float = 1.0) -> list[Tensor]:
    """q, k, v [B, h, N, d]: head views of the column blocks of one [B, N, 3C] leaf."""
    return column_heads(qkv_leaf(tokens, d, dtype, seed, spread))


def reference(variant: str, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The variant's formula in float64 (kernel products, no N×N tensor: N reaches 4099)."""
    n = k.shape[-2]
    if variant == "efficient_softmax":
        return q.softmax(dim=-1) @ (k.softmax(dim=-2).mT @ v)
    if variant == "efficient_scale":
        return (q * n**-0.5) @ ((k * n**-0.5).mT @ v)
    if variant == "taylor":
        qh, kh = F.normalize(q, dim=-1, eps=EPS), F.normalize(k, dim=-1, eps=EPS)
        numerator = v.sum(dim=-2, keepdim=True) + qh @ (kh.mT @ v)
        return numerator / (n + qh @ kh.sum(dim=-2, keepdim=True).mT + EPS)
    phi_q, phi_k = (F.elu(x) + 1 if variant == "elu" else F.relu(x) for x in (q, k))
    return (phi_q @ (phi_k.mT @ v)) / (phi_q @ phi_k.sum(dim=-2, keepdim=True).mT + EPS)


def triton_call(variant: str, q: Tensor, k: Tensor | None, v: Tensor | None, heads: int = 0) -> Tensor:
    """The variant on the Triton kernels: q, k, v [B, h, N, d], or q their [B, N, 3C] qkv (k, v None) of
    ``heads`` heads."""
    n = q.shape[-2] if k is None else k.shape[-2]
    if variant == "efficient_softmax":
        core = KernelCore(FeatureMap("softmax_channels"), FeatureMap("softmax_tokens"), normalize=False)
    elif variant == "efficient_scale":
        core = KernelCore(FeatureMap("identity", n**-0.5), FeatureMap("identity", n**-0.5), normalize=False)
    elif variant == "taylor":
        phi = FeatureMap("l2", eps=EPS)
        core = KernelCore(phi, phi, eps=EPS, taylor_term=True)
    else:
        core = KernelCore(FeatureMap(variant), FeatureMap(variant), eps=EPS)
    return kernel_attention_triton(q, k, v, core, heads)


def relative_error(actual: Tensor, expected: Tensor) -> float:
    """max |actual − expected| / max |expected|, on the CPU (a module's reference runs there)."""
    actual, expected = actual.detach().double().cpu(), expected.detach().cpu()
    return ((actual - expected).abs().max() / expected.abs().max().clamp_min(1e-30)).item()


def assert_close(labels: list[str], actual: list[Tensor], expected: list[Tensor], tolerance: float) -> None:
    errors = {label: relative_error(a, e) for label, a, e in zip(labels, actual, expected, strict=True)}
    assert max(errors.values()) < tolerance, errors


# (variant, N, d, dtype, packed): every N, d, variant and dtype at least once, as q, k, v; a few as the
# packed qkv (k, v None), with its one gradient. N = 1 with an unnormalised variant: a normalised one
# returns v there whatever q and k, so their gradients are rounding noise.
CASES = [
    ("efficient_scale", 1, 16, torch.float32, False),
    ("relu", 7, 32, torch.bfloat16, False),
    ("elu", 1000, 64, torch.float32, False),
    ("taylor", 4099, 16, torch.float32, False),
    ("taylor", 7, 64, torch.bfloat16, False),
    ("efficient_softmax", 1000, 32, torch.float32, False),
    ("efficient_softmax", 7, 16, torch.bfloat16, False),
    ("efficient_scale", 1000, 16, torch.bfloat16, False),
    ("relu", 4099, 32, torch.float32, False),
    ("elu", 300, 16, torch.float32, True),
    ("relu", 7, 32, torch.bfloat16, True),
    ("efficient_softmax", 7, 16, torch.float32, True),
]


@pytest.mark.parametrize(("variant", "tokens", "d", "dtype", "packed"), CASES)
def test_kernel_attention_equals_the_float64_formula(
    variant: str, tokens: int, d: int, dtype: torch.dtype, packed: bool
) -> None:
    qkv = qkv_leaf(tokens, d, dtype)
    q, k, v = column_heads(qkv)
    if packed:  # [B, N, C] out of the kernels; ∂qkv as one tensor (no concatenation in autograd)
        out = heads_view(triton_call(variant, qkv, None, None, HEADS), HEADS)
    else:
        out = triton_call(variant, q, k, v)
    assert out.dtype == dtype and out.transpose(1, 2).is_contiguous()  # v's dtype, [B, N, C] memory
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    if packed:
        grads = column_heads(torch.autograd.grad(out, qkv, upstream.to(dtype))[0])
    else:
        grads = torch.autograd.grad(out, (q, k, v), upstream.to(dtype))
    exact = [t.detach().double().requires_grad_() for t in (q, k, v)]
    expected = reference(variant, *exact)
    expected_grads = torch.autograd.grad(expected, exact, upstream.to(dtype).double())
    assert_close(["out", "∂q", "∂k", "∂v"], [out, *grads], [expected, *expected_grads], TOLERANCE[dtype])


def test_backward_gets_no_zero_gradients_for_the_outputs_kept_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The eager Function leaves the gradients of its saved outputs (context, 1/den, key statistics)
    unmaterialised: backward receives None for them, not zero tensors made for the purpose."""
    received: list[list[bool]] = []
    original = functions.Direct.backward

    def backward(ctx, *grads):
        received.append([grad is None for grad in grads])
        return original(ctx, *grads)

    monkeypatch.setattr(functions.Direct, "backward", staticmethod(backward))
    q, k, v = strided_qkv(8, 16, torch.float32)
    elu = FeatureMap("elu")
    kernel_attention_triton(q, k, v, KernelCore(elu, elu, eps=EPS)).sum().backward()
    assert received == [[False, True, True, True]]


def test_a_launch_tuning_keeps_the_result() -> None:
    """Other block, warp and program counts (``bench op --kernels triton:BxWxP``) compute the same
    formula: here 16-token blocks, 2 warps and one reduction program per multiprocessor."""
    q, k, v = strided_qkv(300, 32, torch.float32)
    with tuned(Tuning.parse("16x2x1")):
        assert Blocks.of(32, 32, torch.float32).BLOCK_N == 16
        out = triton_call("taylor", q, k, v)
        grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    exact = [t.detach().double().requires_grad_() for t in (q, k, v)]
    expected = reference("taylor", *exact)
    expected_grads = torch.autograd.grad(expected, exact, torch.ones_like(expected))
    assert_close(
        ["out", "∂q", "∂k", "∂v"], [out, *grads], [expected, *expected_grads], TOLERANCE[torch.float32]
    )


@pytest.mark.parametrize("text", ["12x4x4", "64x3x4", "64x4", "ax4x4", "0x4x4"])
def test_a_bad_launch_tuning_is_refused_by_name(text: str) -> None:
    with pytest.raises(ValueError, match=f"Triton tuning '{text}'"):
        Tuning.parse(text)


@pytest.mark.parametrize("variant", ["elu", "efficient_softmax"])
def test_fp16_at_many_tokens_stays_finite(variant: str) -> None:
    """Large fp16 inputs over 4099 tokens: the sums exceed fp16's range (65504) in the PyTorch-AMP
    failure mode; here they accumulate in fp32."""
    q, k, v = strided_qkv(4099, 16, torch.float16, spread=30.0)
    out = triton_call(variant, q, k, v)
    grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    assert all(torch.isfinite(t).all() for t in (out, *grads))


def polarity_reference(q: Tensor, k: Tensor, v: Tensor, power: Tensor, eps: float) -> Tensor:
    """PolaFormer's attention written out (kernel products): same-sign q⁺k⁺ᵀ + q⁻k⁻ᵀ for v's first half,
    opposite-sign q⁻k⁺ᵀ + q⁺k⁻ᵀ for the second, each over (its row sum / M + eps); x^± = relu(±x)^p."""
    p, m, half = power.unsqueeze(-2), k.shape[-2], v.shape[-1] // 2
    q_pos, q_neg, k_pos, k_neg = (x.clamp(min=0) ** p for x in (q, -q, k, -k))
    halves = []
    for (a, b), (c, e), values in (
        ((q_pos, k_pos), (q_neg, k_neg), v[..., :half]),
        ((q_neg, k_pos), (q_pos, k_neg), v[..., half:]),
    ):
        numerator = (a @ (b.mT @ values) + c @ (e.mT @ values)) / m
        denominator = (a @ b.sum(-2, keepdim=True).mT + c @ e.sum(-2, keepdim=True).mT) / m + eps
        halves.append(numerator / denominator)
    return torch.cat(halves, dim=-1)


# (N, d, dtype): each N, d and dtype once; 2d features (d = 64: the kernels' 128)
POLARITY_CASES = [(1, 16, torch.float32), (7, 64, torch.bfloat16), (1000, 16, torch.float32)]
POLARITY_CASES += [(4099, 32, torch.float32)]


@pytest.mark.parametrize(("tokens", "d", "dtype"), POLARITY_CASES)
def test_polarity_attention_equals_the_float64_formula(tokens: int, d: int, dtype: torch.dtype) -> None:
    q, k, v = strided_qkv(tokens, d, dtype)
    generator = torch.Generator().manual_seed(4)
    power = (1.5 + 2.5 * torch.rand(HEADS, d, generator=generator)).to(DEVICE).requires_grad_()
    out = polarity_attention_triton(q, k, v, power, EPS)
    assert out.dtype == dtype
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    grads = torch.autograd.grad(out, (q, k, v, power), upstream.to(dtype))
    exact = [t.detach().double().requires_grad_() for t in (q, k, v, power)]
    expected = polarity_reference(*exact, EPS)
    expected_grads = torch.autograd.grad(expected, exact, upstream.to(dtype).double())
    labels = ["out", "∂q", "∂k", "∂v", "∂power"]
    if tokens == 1:  # one key: every output is v up to eps, so ∂q, ∂k, ∂power are rounding noise
        labels, grads, expected_grads = labels[::3], grads[2:3], expected_grads[2:3]
    assert_close(labels, [out, *grads], [expected, *expected_grads], TOLERANCE[dtype])


def module_case(
    name: str,
    options: dict,
    hw: tuple[int, int],
    dim: int,
    dtype: torch.dtype,
    reference_of=module_reference,
) -> None:
    """A module built under SEGATTN_KERNEL=triton, run in ``dtype``, against ``reference_of`` (the explicit
    per-head formula; default ``module_reference``) in float64: output and the gradients of x and every
    parameter."""
    tokens = hw[0] * hw[1]
    module = build_perturbed(name, options, dim, HEADS, tokens)
    assert module.kernel_backend == "triton"
    x = torch.randn(BATCH, tokens, dim, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    upstream = torch.randn(
        BATCH, tokens, dim, generator=torch.Generator().manual_seed(3), dtype=torch.float64
    )
    fast = copy.deepcopy(module).to(DEVICE, dtype)
    leaf = x.to(DEVICE, dtype).requires_grad_()
    out = fast(leaf, hw)
    grads = torch.autograd.grad(out, [leaf, *fast.parameters()], upstream.to(DEVICE, dtype))
    exact = copy.deepcopy(module).double()
    x = x.requires_grad_()
    expected = reference_of(exact, name, options, x, hw)
    expected_grads = torch.autograd.grad(expected, [x, *exact.parameters()], upstream)
    labels = ["out", "∂x", *(f"∂{n}" for n, _ in module.named_parameters())]
    assert_close(labels, [out, *grads], [expected, *expected_grads], TOLERANCE[dtype])


@pytest.mark.usefixtures("forced")
@pytest.mark.parametrize(
    ("hw", "dim", "dtype"), [((15, 20), 32, torch.float32), ((1, 7), 64, torch.bfloat16)]
)
def test_linear_module_equals_the_paper_formula(hw: tuple[int, int], dim: int, dtype: torch.dtype) -> None:
    """The module hands the kernels its [B, N, C] q, k, v (heads read through strides)."""
    module_case("linear", {}, hw, dim, dtype)


class AtenOps(TorchDispatchMode):
    """Counts the ATen ops called inside, but not those of Triton's interpreter while a kernel runs (it
    copies the kernel's tensors in and out: on a GPU the launch is one call)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []
        self.in_kernel = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.in_kernel:
            self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.usefixtures("forced")
def test_a_linear_layer_forward_and_backward_is_two_launches_and_twelve_aten_ops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The token mixing of a ``linear`` layer (everything between the qkv and output projections, as
    ``bench op`` times it) forward and backward: one launch each (the splits of N summed inside the kernel,
    the normaliser with the output) and 12 ATen ops, all of them its buffers (before: 4 launches, 30 ops)."""
    counter, launches = AtenOps(), []

    class Counted:
        def __init__(self, kernel) -> None:
            self.kernel = kernel

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append(self.kernel.fn.__name__)
                counter.in_kernel = True
                try:
                    return self.kernel[grid](*args, **kwargs)
                finally:
                    counter.in_kernel = False

            return launch

    for name in ("forward_kernel", "backward_kernel"):
        monkeypatch.setattr(KERNELS, name, Counted(getattr(KERNELS, name)))
    module = build_perturbed("linear", {}, 32, HEADS, 300).to(DEVICE)
    x = torch.randn(BATCH, 300, 96, generator=torch.Generator().manual_seed(0)).to(DEVICE).requires_grad_()
    q, k, v = x.chunk(3, dim=-1)  # the qkv projection's output
    upstream = torch.randn(BATCH, 300, 32, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    with counter:
        torch.autograd.grad(module.mix_tokens(q, k, v, (15, 20)), (q, k, v), upstream)
    assert launches == ["forward_kernel", "backward_kernel"]
    assert len(counter.names) <= 12, counter.names


@pytest.mark.usefixtures("forced")
@pytest.mark.parametrize(
    ("hw", "dim", "dtype"), [((1, 7), 32, torch.bfloat16), ((15, 20), 128, torch.float32)]
)
def test_flatten_module_equals_the_paper_formula(
    monkeypatch: pytest.MonkeyPatch, hw: tuple[int, int], dim: int, dtype: torch.dtype
) -> None:
    calls = record_operators(monkeypatch)
    module_case("flatten", {}, hw, dim, dtype)
    assert calls == ["focused_attention", "focused_attention_backward"]


@pytest.mark.usefixtures("forced")
def test_litemla_module_equals_the_paper_formula(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = record_operators(monkeypatch)
    module_case("litemla", {}, (6, 9), 32, torch.float32)
    # the q, k, v heads and the 5×5 aggregate's
    assert [name for name in calls if not name.endswith("backward")] == ["kernel_attention"] * 2


@pytest.mark.usefixtures("forced")
@pytest.mark.parametrize(
    ("options", "hw"),
    [({"position_encoding": "learned", "position_size": 6}, (7, 11)), ({"sr_ratio": 2}, (8, 10))],
)
def test_pola_module_equals_the_paper_formula(
    monkeypatch: pytest.MonkeyPatch, options: dict, hw: tuple[int, int]
) -> None:
    """fp32 only: in bf16 the rounded parameters alone move pola's gradients by up to 2.7 % (its powers
    reach 5), on the PyTorch path as much as here; the kernels' bf16 case is the functional test's."""
    calls = record_operators(monkeypatch)
    module_case(
        "pola", options, hw, 32, torch.float32, lambda module, _, __, x, hw: pola_reference(module, x, hw)
    )
    assert calls == ["polarity_attention", "polarity_attention_backward"]


def record(monkeypatch: pytest.MonkeyPatch, function: type[torch.autograd.Function]) -> list[type]:
    """Record each ``apply`` of ``function`` (the original still runs)."""
    calls: list[type] = []
    original = function.apply

    def apply(*args):
        calls.append(function)
        return original(*args)

    monkeypatch.setattr(function, "apply", apply)
    return calls


@pytest.mark.parametrize(
    ("value", "expected"), [(None, "auto"), ("", "auto"), ("torch", "torch"), ("loss", "loss")]
)
def test_kernel_backend_reads_the_setting(
    monkeypatch: pytest.MonkeyPatch, value: str | None, expected: str
) -> None:
    if value is None:
        monkeypatch.delenv(KERNEL_ENV, raising=False)
    else:
        monkeypatch.setenv(KERNEL_ENV, value)
    assert kernel_backend() == expected


def test_kernel_backend_refuses_other_values_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KERNEL_ENV, "cuda")
    expected = r"SEGATTN_KERNEL='cuda'; expected auto .*, head, ffn or residual \(auto and that form\)"
    with pytest.raises(ValueError, match=expected):
        kernel_backend()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a CUDA device")
def test_forcing_triton_on_the_cpu_without_the_interpreter_is_one_error_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(KERNEL_ENV, "triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(
        RuntimeError, match=r"^SEGATTN_KERNEL=triton without a CUDA device needs TRITON_INTERPRET=1"
    ):
        kernel_backend()
    monkeypatch.setattr(fast_path, "interpreted", lambda: False)  # as if triton ran without the interpreter
    with pytest.raises(
        RuntimeError, match=r"^SEGATTN_KERNEL=triton on a cpu tensor needs TRITON_INTERPRET=1"
    ):
        choose_path("triton", torch.zeros(1, 1, 4, 16), triton_head_dim=16)


def test_an_unsupported_head_dim_is_named_when_forced_and_falls_back_otherwise() -> None:
    x = torch.zeros(1, 1, 4, 256, device=DEVICE)
    with pytest.raises(ValueError, match=r"^SEGATTN_KERNEL=triton: head dim 256 is above .* 128"):
        choose_path("triton", x, triton_head_dim=256)
    assert choose_path("auto", x, triton_head_dim=256) != TRITON
    with pytest.raises(ValueError, match=r"^SEGATTN_KERNEL=triton: head dim 80 \(160 features\) is above"):
        choose_path("triton", x, triton_head_dim=80, widening=2)  # pola's polarity features


def test_the_choice_is_stored_when_the_module_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """Built under SEGATTN_KERNEL=torch, a module keeps the PyTorch Functions after the variable changes;
    auto on CPU tensors takes them too; built under SEGATTN_FUSED=0 (the plain formulas), neither, even
    with SEGATTN_KERNEL=triton."""
    monkeypatch.setenv(KERNEL_ENV, "torch")
    module = build_perturbed("linear", {}, 32, HEADS, 12)
    monkeypatch.setenv(KERNEL_ENV, "triton")
    calls = record(monkeypatch, KernelAttention)
    triton_calls = record_operators(monkeypatch)
    x = torch.randn(1, 12, 32)
    module(x, (3, 4))
    module.kernel_backend = "auto"
    module(x, (3, 4))
    monkeypatch.setenv(FUSED_ENV, "0")
    module.kernel_backend = kernel_backend()  # as if built now
    assert module.kernel_backend == "plain"
    module(x, (3, 4))
    assert calls == [KernelAttention] * 2 and triton_calls == []
