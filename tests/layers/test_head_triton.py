"""The decode head's BatchNorm + ReLU + per-image classifier as Triton operators (``layers.head_triton``):
logits and every gradient against BatchNorm2d in training + ReLU + the classifier in float64 (fp32 and bf16;
pixels and channels across blocks, channels-last), the running statistics as nn.BatchNorm2d updates them,
``opcheck`` on each operator, determinism, and ``MLPHead`` taking them under SEGATTN_KERNEL=head with the
PyTorch path's values, gradients and state_dict.

On the CPU through Triton's interpreter (tests/conftest.py); with a CUDA device, compiled."""

from __future__ import annotations

import copy
import importlib.util
from unittest import mock

import pytest
import torch
from torch import Tensor

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from segattn.layers import KERNEL_ENV, head_triton
from segattn.layers.fast_path import paths_of_a_gpu
from segattn.layers.head_triton import batch_norm_relu_classifier
from segattn.models.heads import MLPHead

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def inputs(
    dtype: torch.dtype, channels: int, classes: int, channels_last: bool = False
) -> tuple[Tensor, torch.nn.BatchNorm2d, Tensor, Tensor]:
    """x [2, C, 9, 11] (99 pixels: two of the interpreter's pixel blocks), a BatchNorm2d with random affine
    parameters and statistics, the per-image classifier weight [2, K, C] and its bias."""
    generator = torch.Generator().manual_seed(0)
    x = 2 * torch.randn(2, channels, 9, 11, generator=generator) + 1
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    x = x.to(DEVICE, dtype).contiguous(memory_format=memory_format).requires_grad_()
    norm = torch.nn.BatchNorm2d(channels).to(DEVICE)
    with torch.no_grad():
        for tensor in (norm.weight, norm.bias, norm.running_mean):
            tensor.copy_(torch.randn(channels, generator=generator))
        norm.running_var.uniform_(0.5, 1.5)
    weight = torch.randn(2, classes, channels, generator=generator).to(DEVICE).requires_grad_()
    bias = torch.randn(classes, generator=generator).to(DEVICE).requires_grad_()
    return x, norm, weight, bias


def reference(x: Tensor, norm: torch.nn.BatchNorm2d, weight: Tensor, bias: Tensor) -> Tensor:
    """The PyTorch path's formula: BatchNorm2d in training, ReLU, the classifier of each image."""
    y = norm(x).relu()
    return torch.baddbmm(bias[:, None], weight, y.flatten(2)).unflatten(2, x.shape[-2:])


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize(
    ("channels", "classes", "channels_last"), [(20, 3, False), (260, 19, False), (12, 5, True)]
)
def test_head_operators_match_batch_norm_relu_and_the_classifier_with_gradients(
    dtype: torch.dtype, tolerance: float, channels: int, classes: int, channels_last: bool
) -> None:
    """260 channels: two of the interpreter's channel blocks; the running statistics as nn.BatchNorm2d's."""
    x, norm, weight, bias = inputs(dtype, channels, classes, channels_last)
    exact_norm = copy.deepcopy(norm).double()
    out = batch_norm_relu_classifier(x, norm, weight, bias)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE, dtype)
    grads = torch.autograd.grad(out, (x, norm.weight, norm.bias, weight, bias), grad)
    exact = [t.detach().double().requires_grad_() for t in (x, weight, bias)]
    want = reference(exact[0], exact_norm, exact[1], exact[2])
    want_grads = torch.autograd.grad(
        want, (exact[0], exact_norm.weight, exact_norm.bias, *exact[1:]), grad.double()
    )
    assert out.dtype == grads[0].dtype == dtype and grads[0].stride() == x.stride()
    for got, expected in zip((out, *grads), (want, *want_grads), strict=True):
        scale = expected.abs().max().item()
        torch.testing.assert_close(got.double(), expected, rtol=0, atol=tolerance * scale)
    for name, buffer in exact_norm.named_buffers():
        torch.testing.assert_close(getattr(norm, name).to(buffer.dtype), buffer, rtol=1e-5, atol=1e-6)


def test_a_momentum_of_none_keeps_the_cumulative_average_as_batch_norm_does() -> None:
    x, norm, weight, bias = inputs(torch.float32, 6, 3)
    norm.momentum = None
    want = copy.deepcopy(norm)
    for step in range(2):
        batch = x.detach() * (step + 1)
        batch_norm_relu_classifier(batch, norm, weight, bias)
        want(batch)
    assert norm.num_batches_tracked.item() == 2
    for name, buffer in want.named_buffers():
        torch.testing.assert_close(getattr(norm, name), buffer)


def test_head_operators_pass_opcheck_and_backward_is_deterministic() -> None:
    x, norm, weight, bias = inputs(torch.float32, 12, 5)
    x = x.detach()
    mean, var = torch.ops.segattn.batch_stats(x)
    rstd = torch.rsqrt(var + norm.eps)
    params = (mean, rstd, norm.weight.detach(), norm.bias.detach(), weight.detach())
    grad = torch.randn(2, 5, 9, 11, device=DEVICE)
    coefficients = torch.randn(3, 12, device=DEVICE)
    cases = {
        "batch_stats": (x,),
        "norm_relu_classifier": (x, *params, bias.detach(), torch.float32),
        "norm_relu_classifier_backward": (grad, x, *params),
        "norm_relu_input_grad": (grad, x, *params, coefficients),
    }
    failed = {}
    for name, args in cases.items():
        checks = torch.library.opcheck(getattr(torch.ops.segattn, name).default, args)
        failed |= {f"{name} {test}": result for test, result in checks.items() if result != "SUCCESS"}
    assert failed == {}
    x, norm, weight, bias = inputs(torch.float32, 12, 5)
    first, second = (
        torch.autograd.grad(batch_norm_relu_classifier(x, norm, weight, bias), (x, norm.weight, weight), grad)
        for _ in range(2)
    )
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    ("kernel", "on_gpu", "on_cpu"),
    [("auto", False, False), ("torch", False, False), ("head", True, False), ("triton", True, True)],
)
def test_mlp_head_takes_the_operators_by_the_kernel_setting_in_training_only(
    kernel: str, on_gpu: bool, on_cpu: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SEGATTN_KERNEL=head or triton, read when the head is built: a CUDA device's training step (the CPU's
    under ``triton`` and TRITON_INTERPRET=1), for a BatchNorm with running statistics."""
    monkeypatch.setenv(KERNEL_ENV, kernel)
    with paths_of_a_gpu():
        head = MLPHead([8, 16], num_classes=5, channels=12)
    fused = torch.zeros(2, 12, 3, 3)
    with paths_of_a_gpu():
        assert head.takes_head_operators(fused) == on_gpu
    assert head.takes_head_operators(fused) == on_cpu
    head.fuse.bn.track_running_stats = False
    with paths_of_a_gpu():
        assert not head.takes_head_operators(fused)


def test_mlp_head_on_the_operators_equals_the_pytorch_path_with_its_parameter_gradients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(KERNEL_ENV, "head")
    with paths_of_a_gpu():
        head = MLPHead([8, 16, 24], num_classes=5, channels=12, dropout=0.3).to(DEVICE)
    monkeypatch.setenv(KERNEL_ENV, "torch")
    plain = MLPHead([8, 16, 24], num_classes=5, channels=12, dropout=0.3).to(DEVICE)
    with torch.no_grad():
        for param in head.parameters():
            torch.nn.init.normal_(param)
    plain.load_state_dict(head.state_dict())
    assert list(plain.state_dict()) == list(head.state_dict())
    generator = torch.Generator().manual_seed(2)
    features = [
        torch.randn(2, c, 9 // 2**i + 1, 11 // 2**i + 1, generator=generator)
        for i, c in enumerate((8, 16, 24))
    ]
    features = [feature.to(DEVICE) for feature in features]
    results = []
    for module, calls in ((head, 1), (plain, 0)):
        torch.manual_seed(3)  # the same Dropout2d draw
        operators = mock.patch.object(
            head_triton, "batch_norm_relu_classifier", wraps=batch_norm_relu_classifier
        )
        with paths_of_a_gpu(), operators as called:
            out = module(features)
        assert called.call_count == calls
        grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(4)).to(DEVICE)
        results.append((out, torch.autograd.grad(out, list(module.parameters()), grad)))
    (out, grads), (want, want_grads) = results
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    for got, expected in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    for name, buffer in plain.fuse.bn.named_buffers():
        torch.testing.assert_close(getattr(head.fuse.bn, name), buffer, rtol=1e-5, atol=1e-5)


def test_mlp_head_on_the_operators_compiles_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under torch.compile (one graph, no break) the operators and the running statistics' update stay in
    it, with eager's logits."""
    from torch._dynamo.testing import CompileCounterWithBackend

    monkeypatch.setenv(KERNEL_ENV, "head")
    with paths_of_a_gpu():
        head = MLPHead([8, 16], num_classes=5, channels=12, dropout=0.0).to(DEVICE)
        features = [torch.randn(2, 8, 6, 6, device=DEVICE), torch.randn(2, 16, 3, 3, device=DEVICE)]
        eager = head(features)
        counter = CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(head, backend=counter, fullgraph=True)(features)
    assert counter.frame_count == 1 and head.fuse.bn.num_batches_tracked.item() == 2
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
