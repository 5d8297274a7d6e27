"""Mixed precision: large activations under bf16 autocast stay finite and close to fp32, and the token
reductions and feature maps run in fp32 with only the final result rounded to bf16."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from attention_reference import (
    KNOWN_VARIANTS,
    all_variants,
    build_for_tokens,
    focus,
    function_of,
    linear_variants,
    parametrize_variants,
    variant_id,
    variant_weights,
)
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from segattn.attention import focused_feature_map

# Relative error ‖bf16 − fp32‖ / ‖fp32‖ of the output and of ∂loss/∂x at N = 16384, |x| ≤ 50, stated per
# variant (measured worst of 3 seeds in brackets). qkv and proj run in bf16 (rounding 2⁻⁹ ≈ 2e-3), so every
# variant moves by ~5e-3. Softmax-like kernels amplify that: logits of a few hundred shift by O(1) (softmax
# gradients differ by ~65%, so only their finiteness is checked). relu features have a kink at 0: rows with
# one or two small positive channels have ill-conditioned gradients.
TOLERANCE: dict[str, tuple[float, float | None]] = {
    "softmax": (0.15, None),  # [0.076, 0.66]
    "sra": (0.05, 0.1),  # [0.014, 0.034]
    "efficient-softmax": (0.06, 0.15),  # [0.031, 0.051]
    "efficient-scale": (0.01, 0.02),  # [0.0051, 0.0051]
    "linear-elu": (0.01, 0.02),  # [0.0050, 0.0103]
    "linear-relu": (0.01, 0.15),  # [0.0051, 0.067]
    "taylor": (0.01, 0.02),  # [0.0048, 0.0053]
    "flatten": (0.01, 0.02),  # [0.0049, 0.0061]
    "litemla": (0.01, 0.15),  # [0.0057, 0.061]; relu's kink, as linear-relu
    "performer": (0.08, 0.2),  # [0.039, 0.090]
    "nystrom": (0.06, 0.1),  # [0.030, 0.046]
    "linformer": (0.12, None),  # [0.060, 0.45] with max_tokens=16384; skipped at its default 4096
    "agent": (0.04, 0.1),  # [0.020, 0.051]: two softmaxes over bf16 logits
    "pola": (0.01, 0.02),  # [0.0060, 0.0063]
}
DEFAULT_TOLERANCE = (0.02, 0.06)  # a variant not listed above

# The CUDA case runs where a GPU is lent (CI has none); docs/performance.md, "On a GPU".
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")),
]
BF16_ROUNDING = 2.0**-8  # round-to-nearest bf16 moves a value by at most this fraction of itself


def relative_error(approx: Tensor, exact: Tensor) -> float:
    return ((approx.float() - exact).norm() / exact.norm()).item()


@parametrize_variants(all_variants())
@pytest.mark.parametrize("device", DEVICES)
def test_bf16_autocast_with_large_activations_at_16k_tokens(
    name: str, options: dict[str, Any], device: str
) -> None:
    hw = (128, 128)
    torch.manual_seed(0)
    module = build_for_tokens(name, options, 32, 2, hw[0] * hw[1]).to(device)
    x = (torch.rand(1, hw[0] * hw[1], 32, device=device) * 100 - 50).requires_grad_()  # |x| up to 50
    upstream = torch.randn(1, hw[0] * hw[1], 32, device=device)

    out_tolerance, grad_tolerance = TOLERANCE.get(variant_id(name, options), DEFAULT_TOLERANCE)
    with torch.autocast(device, dtype=torch.bfloat16):
        out16 = module(x, hw)
    (grad16,) = torch.autograd.grad((out16.float() * upstream).sum(), x)
    assert out16.dtype == torch.bfloat16
    assert torch.isfinite(out16).all() and torch.isfinite(grad16).all()

    out32 = module(x, hw)
    assert relative_error(out16, out32) <= out_tolerance
    if grad_tolerance is not None:
        (grad32,) = torch.autograd.grad((out32 * upstream).sum(), x)
        assert relative_error(grad16, grad32) <= grad_tolerance


LINEAR_KNOWN = [(n, o) for n, o in KNOWN_VARIANTS if n != "softmax"]


@parametrize_variants(LINEAR_KNOWN)
def test_functions_compute_in_fp32_and_round_once(name: str, options: dict[str, Any]) -> None:
    """Under autocast, bf16 q, k, v give the exact result rounded to bf16 once; evaluating the same
    formula in bf16 throughout does not meet that bound, so the check tells the two apart."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.rand(1, 2, 1024, 16, generator=gen) * 100 - 50 for _ in range(3))
    if name == "flatten":
        q, k = q.abs(), k.abs()
    q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
    exact = variant_weights(name, options, q.double(), k.double()) @ v.double()
    bound = BF16_ROUNDING * exact.abs() + 1e-5 * exact.abs().max()

    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = function_of(name, options)(q, k, v)
    assert out.dtype == torch.bfloat16
    assert ((out.double() - exact).abs() <= bound).all()

    pure_bf16 = variant_weights(name, options, q, k) @ v
    assert not ((pure_bf16.double() - exact).abs() <= bound).all()


def test_focused_feature_map_computes_in_fp32_and_rounds_once() -> None:
    x = (torch.rand(2, 512, 32) * 50).bfloat16()
    exact = focus(x.double(), 3.0)
    bound = BF16_ROUNDING * exact.abs() + 1e-5 * exact.abs().amax(-1, keepdim=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = focused_feature_map(x, 3.0)
    assert out.dtype == torch.bfloat16
    assert ((out.double() - exact).abs() <= bound).all()
    assert not ((focus(x, 3.0).double() - exact).abs() <= bound).all()


class PrecisionRecorder(TorchDispatchMode):
    """Records the ops that must run in fp32: matmuls that sum over the N tokens, and every reduction or
    non-linearity (feature maps, norms, softmax, sums); linear layers over C channels may stay bf16."""

    NONLINEAR = ("exp", "pow", "elu", "_softmax", "softplus", "log", "sqrt", "rsqrt", "linalg_vector_norm")
    REDUCTIONS = ("sum", "mean", "amax", "norm", "div")
    MATMULS = ("mm", "bmm", "addmm", "baddbmm")

    def __init__(self, tokens: int) -> None:
        super().__init__()
        self.tokens = tokens
        self.low_precision: list[str] = []
        self.checked = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        op = func.overloadpacket.__name__
        matrices = [a for a in args if isinstance(a, Tensor) and a.dim() >= 2]
        sums_tokens = op in self.MATMULS and matrices[-2].shape[-1] >= self.tokens
        if sums_tokens or op in self.NONLINEAR or op in self.REDUCTIONS:
            self.checked += 1
            dtypes = {t.dtype for t in tree_flatten(out)[0] if isinstance(t, Tensor)}
            if dtypes & {torch.bfloat16, torch.float16}:
                self.low_precision.append(f"{func}{[tuple(a.shape) for a in matrices]}")
        return out


def test_precision_recorder_flags_a_token_sum_in_bf16() -> None:
    """The control for the test below: a KᵀV product over the tokens left in bf16 under autocast, and a
    bf16 sum over them, are both reported (so an empty report there means fp32, not a blind recorder)."""
    k, v = torch.randn(1, 256, 16), torch.randn(1, 256, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16), PrecisionRecorder(256) as recorder:
        context = k.transpose(1, 2) @ v
        context.sum()
    assert len(recorder.low_precision) == 2 and "bmm" in recorder.low_precision[0]


@parametrize_variants(linear_variants())
def test_modules_reduce_tokens_in_fp32_under_autocast(name: str, options: dict[str, Any]) -> None:
    hw = (16, 16)
    module = build_for_tokens(name, options, 32, 2, hw[0] * hw[1])
    x = torch.randn(1, hw[0] * hw[1], 32)
    with torch.autocast("cpu", dtype=torch.bfloat16), PrecisionRecorder(hw[0] * hw[1]) as recorder:
        out = module(x, hw)
    assert out.dtype == torch.bfloat16
    assert recorder.checked > 0
    assert recorder.low_precision == []
