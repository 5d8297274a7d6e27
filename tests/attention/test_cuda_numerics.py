"""The CUDA paths compute what the CPU paths compute: every variant on the GPU in fp32 (TF32 off) equals its
float64 CPU result (itself checked against the quadratic formula), fused and plain paths agree on the GPU,
and bf16 autocast at 16k tokens stays finite and within the CPU test's tolerances.

Skipped without a CUDA device: CI has none, so these run where a GPU is lent (README, "On a GPU").
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from attention_reference import all_variants, build_for_tokens, parametrize_variants, variant_id
from test_zoo_numerics import DEFAULT_TOLERANCE, TOLERANCE, relative_error
from torch import Tensor

from segattn.layers import FUSED_ENV

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CUDA = torch.device("cuda")
BATCH, HW, DIM, HEADS = 2, (12, 20), 32, 2  # a non-square grid
TOKENS = HW[0] * HW[1]
FP32 = {"rtol": 1e-4, "atol": 1e-5}  # fp32 on the GPU against float64: summation order only


@pytest.fixture(autouse=True)
def exact_fp32() -> Iterator[None]:
    """TF32 off for matmuls and convolutions, so fp32 means fp32 (cuDNN convolutions default to TF32)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def build(name: str, options: dict[str, Any]) -> torch.nn.Module:
    """The variant in eval mode (no Performer redraw) with every parameter moved off its initial value."""
    torch.manual_seed(0)
    module = build_for_tokens(name, options, DIM, HEADS, TOKENS).eval()
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return module


def output_and_gradients(module: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> list[Tensor]:
    """Output, ∂x and every parameter gradient of a fixed random loss, returned as float64 on the CPU."""
    module = copy.deepcopy(module).to(device=device, dtype=dtype)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, TOKENS, DIM, generator=generator, dtype=torch.float64)
    upstream = torch.randn(BATCH, TOKENS, DIM, generator=generator, dtype=torch.float64)
    x = x.to(device=device, dtype=dtype).requires_grad_()
    out = module(x, HW)
    grads = torch.autograd.grad(
        (out * upstream.to(device=device, dtype=dtype)).sum(), [x, *module.parameters()]
    )
    return [t.detach().double().cpu() for t in (out, *grads)]


def assert_all_close(
    actual: list[Tensor], expected: list[Tensor], labels: list[str], **tolerance: float
) -> None:
    for label, a, e in zip(labels, actual, expected, strict=True):
        torch.testing.assert_close(a, e, **tolerance, msg=lambda text, label=label: f"{label}: {text}")


def labels_of(module: torch.nn.Module) -> list[str]:
    return ["out", "∂x", *(f"∂{name}" for name, _ in module.named_parameters())]


@parametrize_variants(all_variants())
def test_cuda_fp32_equals_cpu_float64(name: str, options: dict[str, Any]) -> None:
    module = build(name, options)
    expected = output_and_gradients(module, torch.device("cpu"), torch.float64)
    actual = output_and_gradients(module, CUDA, torch.float32)
    assert_all_close(actual, expected, labels_of(module), **FP32)


@parametrize_variants(all_variants())
def test_cuda_fused_and_plain_paths_agree(
    monkeypatch: pytest.MonkeyPatch, name: str, options: dict[str, Any]
) -> None:
    module = build(name, options)
    monkeypatch.delenv(FUSED_ENV, raising=False)
    fused = output_and_gradients(module, CUDA, torch.float32)
    monkeypatch.setenv(FUSED_ENV, "0")
    plain = output_and_gradients(module, CUDA, torch.float32)
    assert_all_close(fused, plain, labels_of(module), **FP32)


@parametrize_variants(all_variants())
def test_cuda_bf16_autocast_at_16k_tokens(name: str, options: dict[str, Any]) -> None:
    hw = (128, 128)
    torch.manual_seed(0)
    module = build_for_tokens(name, options, 32, 2, hw[0] * hw[1]).to(CUDA)
    x = (torch.rand(1, hw[0] * hw[1], 32, device=CUDA) * 100 - 50).requires_grad_()  # |x| up to 50
    upstream = torch.randn(1, hw[0] * hw[1], 32, device=CUDA)

    out_tolerance, grad_tolerance = TOLERANCE.get(variant_id(name, options), DEFAULT_TOLERANCE)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out16 = module(x, hw)
    (grad16,) = torch.autograd.grad((out16.float() * upstream).sum(), x)
    assert out16.dtype == torch.bfloat16
    assert torch.isfinite(out16).all() and torch.isfinite(grad16).all()

    out32 = module(x, hw)
    assert relative_error(out16, out32) <= out_tolerance
    if grad_tolerance is not None:
        (grad32,) = torch.autograd.grad((out32 * upstream).sum(), x)
        assert relative_error(grad16, grad32) <= grad_tolerance
