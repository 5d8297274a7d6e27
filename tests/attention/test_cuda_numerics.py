"""The CUDA paths compute what the CPU paths compute: every variant on the GPU in fp32 (TF32 off) equals its
float64 CPU result (itself checked against the quadratic formula), and the Function and plain paths agree on
the GPU. bf16 autocast at 16k tokens on the GPU is a case of test_zoo_numerics.py.

Skipped without a CUDA device: CI has none, so these run where a GPU is lent (`make device-check`;
docs/performance.md, "On a GPU").
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from attention_reference import all_variants, build_perturbed, parametrize_variants
from torch import Tensor

from segattn.layers import FUSED_ENV

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.usefixtures("exact_fp32"),
]
CUDA = torch.device("cuda")
BATCH, HW, DIM, HEADS = 2, (12, 20), 32, 2  # a non-square grid
TOKENS = HW[0] * HW[1]
FP32 = {"rtol": 1e-4, "atol": 1e-5}  # fp32 on the GPU against float64: summation order only


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


def assert_all_close(actual: list[Tensor], expected: list[Tensor], module: torch.nn.Module) -> None:
    labels = ["out", "∂x", *(f"∂{name}" for name, _ in module.named_parameters())]
    for label, a, e in zip(labels, actual, expected, strict=True):
        torch.testing.assert_close(a, e, **FP32, msg=lambda text, label=label: f"{label}: {text}")


@parametrize_variants(all_variants())
def test_cuda_fp32_equals_cpu_float64(name: str, options: dict[str, Any]) -> None:
    module = build_perturbed(name, options, DIM, HEADS, TOKENS)
    expected = output_and_gradients(module, torch.device("cpu"), torch.float64)
    assert_all_close(output_and_gradients(module, CUDA, torch.float32), expected, module)


@parametrize_variants(all_variants())
def test_cuda_function_and_plain_paths_agree(
    monkeypatch: pytest.MonkeyPatch, name: str, options: dict[str, Any]
) -> None:
    monkeypatch.delenv(FUSED_ENV, raising=False)
    module = build_perturbed(name, options, DIM, HEADS, TOKENS)
    functions = output_and_gradients(module, CUDA, torch.float32)
    monkeypatch.setenv(FUSED_ENV, "0")
    plain = build_perturbed(name, options, DIM, HEADS, TOKENS)  # the same seeded weights, built plain
    assert_all_close(functions, output_and_gradients(plain, CUDA, torch.float32), module)
