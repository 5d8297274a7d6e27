"""SEGATTN_FUSED=0 takes every variant off its hand-written autograd Functions and onto the plain formulas,
with the same outputs and gradients (fp32, float tolerance); by default the autograd Functions run.

A module reads the variable once, when it is built (``kernel_backend``: "plain"), and keeps that path; a
functional call outside a module (``choose_path`` without a backend) reads it at each call.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from attention_reference import all_variants, build_perturbed, parametrize_variants
from torch import Tensor

from segattn.attention.autograd.focus import FocusedAttention
from segattn.attention.autograd.kernel import KernelAttention
from segattn.attention.autograd.polarity import PolarityFeatures
from segattn.layers import (
    FUNCTION,
    FUSED_ENV,
    KERNEL_ENV,
    PLAIN,
    TRITON,
    choose_path,
    kernel_backend,
    loss_path,
)
from segattn.layers.depthwise import DepthwiseConv
from segattn.layers.fast_path import paths_of_a_gpu

FUNCTIONS: list[type[torch.autograd.Function]] = [
    KernelAttention,
    FocusedAttention,
    DepthwiseConv,
    PolarityFeatures,
]
# Variants with a Function path and the Functions it runs on CPU in eager mode; every other registered variant
# runs none (checked below, so a new Function path must be listed here).
FUNCTION_VARIANTS: list[tuple[str, dict[str, Any], set[type[torch.autograd.Function]]]] = [
    ("efficient", {"normalization": "softmax"}, {KernelAttention}),
    ("efficient", {"normalization": "scale"}, {KernelAttention}),
    ("linear", {"feature_map": "elu"}, {KernelAttention}),
    ("linear", {"feature_map": "relu"}, {KernelAttention}),
    ("taylor", {}, {KernelAttention}),
    ("flatten", {}, {FocusedAttention, DepthwiseConv}),  # its DWC is 5×5: DepthwiseConv's backward
    ("performer", {}, {KernelAttention}),
    ("nystrom", {"conv_kernel": 5}, {DepthwiseConv}),  # the V conv over 3×3 takes DepthwiseConv
    ("litemla", {}, {DepthwiseConv}),  # its 5×5 aggregation
    ("pola", {}, {PolarityFeatures, DepthwiseConv}),  # its DWC is 5×5
]
WITH_FUNCTIONS = parametrize_variants([(name, options) for name, options, _ in FUNCTION_VARIANTS])
BATCH, HW, DIM, HEADS = 2, (8, 8), 32, 2
TOKENS = HW[0] * HW[1]
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}  # fp32: the Function and plain paths sum in different orders


def expected_functions(name: str, options: dict[str, Any]) -> set[type[torch.autograd.Function]]:
    return next((functions for n, o, functions in FUNCTION_VARIANTS if (n, o) == (name, options)), set())


def build(name: str, options: dict[str, Any]) -> torch.nn.Module:
    return build_perturbed(name, options, DIM, HEADS, TOKENS)


def forward_and_gradients(module: torch.nn.Module) -> tuple[Tensor, list[Tensor]]:
    """The module's forward (its steps spelt out; dropout is 0) and the gradients of a fixed random loss
    w.r.t. x, the mixing step's q, k, v (strided chunks of one [B, N, 3C] tensor) and every parameter."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, TOKENS, DIM, generator=generator).requires_grad_()
    q, k, v = module.project(x, HW)
    out = module.proj(module.mix_tokens(q, k, v, HW))
    upstream = torch.randn(out.shape, generator=generator)
    inputs = [x, q, k, v, *module.parameters()]
    grads = torch.autograd.grad((out * upstream).sum(), inputs, allow_unused=True)
    return out.detach(), [torch.zeros_like(t) if g is None else g for t, g in zip(inputs, grads, strict=True)]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[type[torch.autograd.Function]]:
    """Every autograd Function's ``apply``, recorded; the original still runs."""
    recorded: list[type[torch.autograd.Function]] = []
    for function in FUNCTIONS:

        def record(*args: Any, _function: Any = function, _apply: Any = function.apply) -> Any:
            recorded.append(_function)
            return _apply(*args)

        monkeypatch.setattr(function, "apply", record)
    return recorded


@pytest.mark.parametrize(("value", "expected"), [(None, True), ("", True), ("1", True), ("0", False)])
def test_choose_path_without_a_module_follows_the_variable_at_each_call(
    monkeypatch: pytest.MonkeyPatch, value: str | None, expected: bool
) -> None:
    if value is None:
        monkeypatch.delenv(FUSED_ENV, raising=False)
    else:
        monkeypatch.setenv(FUSED_ENV, value)
    assert (choose_path(None, torch.zeros(1)) == FUNCTION) is expected


def test_choose_path_refuses_other_values_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FUSED_ENV, "false")
    with pytest.raises(ValueError, match=r"SEGATTN_FUSED='false'; expected 0 .* or 1"):
        choose_path(None, torch.zeros(1))


@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated")
def test_tracing_takes_the_plain_path_even_with_functions_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FUSED_ENV, "1")
    seen: list[bool] = []

    def probe(x: Tensor) -> Tensor:
        seen.append(choose_path(None, x) == FUNCTION)
        return x + 1

    torch.jit.trace(probe, torch.zeros(2), check_trace=False)
    assert seen == [False]


@WITH_FUNCTIONS
def test_functions_off_gives_the_default_outputs_and_gradients(
    monkeypatch: pytest.MonkeyPatch, name: str, options: dict[str, Any], calls: list[type]
) -> None:
    monkeypatch.delenv(FUSED_ENV, raising=False)
    module = build(name, options)
    monkeypatch.setenv(FUSED_ENV, "0")
    plain_module = build(name, options)  # the same weights (build_perturbed is seeded), built plain
    assert (module.kernel_backend, plain_module.kernel_backend) == ("auto", PLAIN)
    function_out, function_grads = forward_and_gradients(
        module
    )  # the variable now says 0: the module keeps its path
    assert set(calls) == expected_functions(name, options)  # the default really ran the Function path
    plain_out, plain_grads = forward_and_gradients(plain_module)
    assert set(calls) == expected_functions(name, options)  # and the plain run added none

    torch.testing.assert_close(plain_out, function_out, **TOLERANCE)
    labels = ["x", "q", "k", "v", *(label for label, _ in module.named_parameters())]
    for label, plain, function in zip(labels, plain_grads, function_grads, strict=True):
        torch.testing.assert_close(
            plain, function, **TOLERANCE, msg=lambda text, label=label: f"∂{label}: {text}"
        )


@WITH_FUNCTIONS
def test_functions_off_never_calls_an_autograd_function(
    monkeypatch: pytest.MonkeyPatch, name: str, options: dict[str, Any]
) -> None:
    def refuse(*args: Any) -> Any:
        raise AssertionError("an autograd Function ran with SEGATTN_FUSED=0")

    for function in FUNCTIONS:
        monkeypatch.setattr(function, "apply", refuse)
    monkeypatch.setenv(FUSED_ENV, "0")
    out, grads = forward_and_gradients(build(name, options))
    assert out.isfinite().all() and all(grad.isfinite().all() for grad in grads)


@parametrize_variants(
    [
        (name, options)
        for name, options in all_variants()
        if not any((name, options) == (n, o) for n, o, _ in FUNCTION_VARIANTS)
    ]
)
def test_variants_not_listed_run_no_autograd_function(
    monkeypatch: pytest.MonkeyPatch, name: str, options: dict[str, Any], calls: list[type]
) -> None:
    monkeypatch.delenv(FUSED_ENV, raising=False)
    forward_and_gradients(build(name, options))
    assert calls == []


@pytest.mark.parametrize(
    ("kernel", "dtype", "classes", "expected"),
    [
        (None, torch.float32, 19, PLAIN),  # unset: "auto", which leaves the fused loss out
        ("auto", torch.bfloat16, 19, PLAIN),  # a GPU's default too: the fused loss is opt-in
        ("triton", torch.float32, 19, TRITON),
        ("triton", torch.bfloat16, 128, TRITON),
        ("triton", torch.float32, 129, PLAIN),  # wider than the kernels' classes
        ("triton", torch.float64, 19, PLAIN),
        ("torch", torch.float32, 19, PLAIN),
    ],
)
def test_the_fused_loss_takes_the_triton_path_by_its_rule(
    monkeypatch: pytest.MonkeyPatch, kernel: str | None, dtype: torch.dtype, classes: int, expected: str
) -> None:
    monkeypatch.delenv(KERNEL_ENV, raising=False)
    if kernel is not None:
        monkeypatch.setenv(KERNEL_ENV, kernel)
    with paths_of_a_gpu():  # a CUDA device's choice, on this CPU
        assert loss_path(kernel_backend(), torch.zeros(1, dtype=dtype), classes) == expected
