"""The fused loss operator (``training.fused_loss``: upsampling, cross entropy and Dice sums in one Triton
kernel, its backward at the logits' resolution) equals SegLoss on the logits upsampled to the image: its
upsampling tables follow ``F.interpolate``, its value and gradient match the float64 loss within fp32 (and
bf16) rounding; both operators pass ``torch.library.opcheck``; ``head_losses`` takes it on the Triton path
only, and keeps nothing of the image's size for backward.

On the CPU through Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1), so sizes are tiny.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F
from train_overrides import tiny_pvt

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from segattn.layers import KERNEL_ENV, kernel_backend
from segattn.training import fused_loss
from segattn.training.fused_loss import axis_table, fused_seg_loss
from segattn.training.losses import SegLoss
from segattn.training.module import SegmentationModule

DEVICE = torch.device("cpu" if fused_loss.loss_kernels().INTERPRETED else "cuda")
IGNORE = 255
K = 5


def batch(low: tuple[int, int], image: tuple[int, int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 logits [2, K, *low] and labels [2, *image] with ignore pixels; class K − 1 absent."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, K, *low, generator=generator, dtype=torch.float64) * 3
    target = torch.randint(0, K - 1, (2, *image), generator=generator)
    target[torch.rand(target.shape, generator=generator) < 0.2] = IGNORE
    return logits, target


def reference(criterion: SegLoss, logits: torch.Tensor, target: torch.Tensor, size) -> tuple:
    """Today's loss in float64: upsampled to ``size``, cropped to the mask, scored by SegLoss; and its
    gradient."""
    logits = logits.detach().double().clone().requires_grad_()
    upsampled = F.interpolate(logits, size=size, mode="bilinear", align_corners=False)
    loss = criterion.double()(upsampled[..., : target.shape[-2], : target.shape[-1]], target)
    loss.backward()
    return loss.detach(), logits.grad


def fused(criterion: SegLoss, logits: torch.Tensor, target: torch.Tensor, size) -> tuple:
    logits = logits.detach().to(DEVICE).clone().requires_grad_()
    loss = fused_seg_loss(criterion.float().to(DEVICE), logits, target.to(DEVICE), size)
    loss.backward()
    return loss.detach().cpu(), logits.grad.cpu()


@pytest.mark.parametrize(("low", "size"), [(3, 11), (5, 20), (7, 7), (9, 4)])
def test_upsampling_tables_follow_interpolate(low: int, size: int) -> None:
    """Per output index, the lower and upper source index and the upper one's weight give
    ``F.interpolate``'s weights; every output a source index weighs in lies in that index's range."""
    lower, upper, fraction, start, stop = axis_table(low, size, torch.device("cpu"))
    one_hot = torch.eye(low).reshape(1, low, low, 1)  # channel j: the unit input at source index j
    expected = F.interpolate(one_hot, size=(size, 1), mode="bilinear", align_corners=False)[0, :, :, 0]
    got = torch.zeros(low, size)
    outputs = torch.arange(size)
    got.index_put_((lower.long(), outputs), 1 - fraction, accumulate=True)
    got.index_put_((upper.long(), outputs), fraction, accumulate=True)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    in_range = (outputs >= start[:, None]) & (outputs < stop[:, None])
    assert not got[~in_range].any()


LOSSES = {
    "ce": {},
    "ce+dice": {"dice": 1.0},
    "dice over every class": {"ce": 0.0, "dice": 1.0, "dice_present_only": False},
    "weighted, smoothed ce + dice": {
        "ce": 0.7,
        "dice": 0.5,
        "class_weights": [1.0, 2.5, 0.3, 4.0, 1.5],
        "label_smoothing": 0.1,
    },
}


@pytest.mark.parametrize("options", LOSSES.values(), ids=LOSSES.keys())
@pytest.mark.parametrize(
    ("low", "size", "crop"),
    [((3, 5), (11, 19), (10, 17)), ((4, 3), (4, 3), (4, 3)), ((2, 35), (5, 70), (5, 67))],
    ids=["upsampled, padded, odd", "same size", "wide: three forward spans, two backward blocks"],
)
def test_fused_loss_equals_the_loss_on_upsampled_logits(options, low, size, crop) -> None:
    logits, target = batch(low, crop)
    criterion = SegLoss(K, ignore_index=IGNORE, **options)
    expected, expected_grad = reference(criterion, logits, target, size)
    got, grad = fused(criterion, logits.float(), target, size)
    assert got.dtype == grad.dtype == torch.float32
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad.double(), expected_grad, rtol=0, atol=1e-5 * expected_grad.abs().max())


def test_bfloat16_logits_are_scored_in_float32() -> None:
    """bf16 logits are read as they are (here channels-last) and scored in fp32: the loss is the float64
    loss of the same values within fp32 rounding; the gradient has the logits' dtype and memory order."""
    logits, target = batch((3, 4), (9, 15))
    half = logits.bfloat16().to(memory_format=torch.channels_last)
    criterion = SegLoss(K, dice=1.0, ignore_index=IGNORE, label_smoothing=0.05)
    expected, expected_grad = reference(criterion, half, target, (12, 16))
    got, grad = fused(criterion, half, target, (12, 16))
    assert got.dtype == torch.float32 and grad.dtype == torch.bfloat16
    assert grad.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad.double(), expected_grad, rtol=0, atol=1e-2 * expected_grad.abs().max())


def test_a_batch_without_valid_pixels_gives_zero() -> None:
    logits = torch.randn(1, K, 2, 3)
    target = torch.full((1, 8, 12), IGNORE)
    loss, grad = fused(SegLoss(K, dice=1.0, ignore_index=IGNORE), logits, target, (8, 12))
    assert loss.item() == 0 and not grad.any()


def test_no_tensor_of_the_image_size_is_kept_for_backward() -> None:
    """Saved for backward besides the inputs (held by reference): the class weights and sums, [K] at most."""
    logits, target = batch((3, 4), (12, 16))
    logits, target = logits.float().to(DEVICE).requires_grad_(), target.to(DEVICE)
    inputs = {logits.untyped_storage().data_ptr(), target.untyped_storage().data_ptr()}
    saved = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.untyped_storage().data_ptr() not in inputs:
            saved.append(tensor.numel())
        return tensor

    criterion = SegLoss(K, dice=1.0, ignore_index=IGNORE).to(DEVICE)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        fused_seg_loss(criterion, logits, target, (12, 16)).backward()
    assert saved and max(saved) <= K


def opcheck(name: str, args: tuple) -> None:
    results = torch.library.opcheck(getattr(torch.ops.segattn, name).default, args, raise_exception=False)
    failures = {test: str(result) for test, result in results.items() if result != "SUCCESS"}
    assert not failures, failures


def test_loss_operators_pass_opcheck() -> None:
    logits, target = batch((2, 2), (5, 6))
    logits, target = logits.float().to(DEVICE).requires_grad_(), target.to(DEVICE)
    settings = ([6, 7], IGNORE, 0.1, True)
    weights = torch.linspace(0.5, 2.0, K, device=DEVICE)
    opcheck("seg_loss_sums", (logits, target, weights, *settings))
    grad = torch.randn(2 + 3 * K, device=DEVICE)
    opcheck("seg_loss_sums_backward", (grad, logits.detach(), target, weights, *settings))


def head_losses(model, criterion: SegLoss, images, masks, monkeypatch) -> tuple[list, list[str]]:
    """``SegmentationModule.head_losses`` (main + aux loss), the parameters' gradients, and the losses the
    fused path ran (by name)."""
    calls = []
    monkeypatch.setattr(
        "segattn.training.module.fused_seg_loss",
        lambda *a, **k: calls.append("fused") or fused_seg_loss(*a, **k),
    )
    members = {"model": model, "criterion": criterion, "kernel_backend": kernel_backend()}  # read as built
    holder = type("Holder", (), members)()
    model.zero_grad()
    loss, aux_loss = SegmentationModule.head_losses(holder, images, masks)
    (loss + aux_loss).backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    return [loss.detach(), aux_loss.detach(), *grads], calls


def test_head_losses_take_the_fused_loss_on_the_triton_path_only(monkeypatch) -> None:
    """On the Triton path (SEGATTN_KERNEL=triton, on CUDA too: the default leaves it out; here through the
    interpreter) a cross entropy + Dice loss of both heads runs fused, equal to the upsampled path within
    fp32 rounding (odd image: padded, then cropped); Lovász keeps the upsampled path; without the setting,
    nothing changes."""
    model = tiny_pvt(aux_head=True).to(DEVICE)
    images = torch.randn(1, 3, 30, 20, device=DEVICE)
    masks = torch.randint(0, 3, (1, 30, 20), device=DEVICE)
    criterion = SegLoss(3, dice=1.0).to(DEVICE)
    plain, calls = head_losses(model, criterion, images, masks, monkeypatch)
    assert calls == []
    monkeypatch.setenv(KERNEL_ENV, "triton")
    fused_results, calls = head_losses(model, criterion, images, masks, monkeypatch)
    assert calls == ["fused", "fused"]
    for got, expected in zip(fused_results, plain, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)
    _, calls = head_losses(model, SegLoss(3, lovasz=1.0).to(DEVICE), images, masks, monkeypatch)
    assert calls == []


def test_torch_compile_keeps_the_fused_loss_as_one_operator() -> None:
    """Compiled whole (one graph, no break), the forward operator stays in it, and the value and gradient
    equal eager's. (Dice over the present classes only branches on the labels, a graph break of its own.)"""
    from torch._dynamo.testing import CompileCounterWithBackend

    logits, target = batch((3, 4), (10, 13))
    criterion = SegLoss(K, dice=1.0, dice_present_only=False, ignore_index=IGNORE).to(DEVICE)
    target = target.to(DEVICE)
    eager = logits.float().to(DEVICE).requires_grad_()
    expected = fused_seg_loss(criterion, eager, target, (12, 16))
    expected.backward()
    counter = CompileCounterWithBackend("aot_eager")
    compiled_loss = torch.compile(fused_seg_loss, backend=counter, fullgraph=True)
    compiled = eager.detach().clone().requires_grad_()
    got = compiled_loss(criterion, compiled, target, (12, 16))
    got.backward()
    assert counter.frame_count == 1
    nodes = [str(node.target) for node in counter.graphs[0].graph.nodes]
    assert any("seg_loss_sums" in node for node in nodes), nodes
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(compiled.grad, eager.grad)
