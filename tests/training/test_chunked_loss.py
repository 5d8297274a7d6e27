"""The row-chunked loss (``loss.chunk_rows``) equals SegLoss on the logits upsampled to the image, value and
gradient, in float64; it keeps no full-resolution tensor from forward to backward; bad combinations are
refused before training."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from reliability_fixtures import BASE, compose_run
from train_overrides import TINY_MODEL, tiny_pvt

from segattn.layers import kernel_backend
from segattn.training import run as train
from segattn.training.chunked_loss import bilinear_rows, chunked_seg_loss
from segattn.training.losses import SegLoss
from segattn.training.module import SegmentationModule

IGNORE = 255
K = 4


def upsampled(logits: torch.Tensor, size: tuple[int, int], height: int, width: int) -> torch.Tensor:
    """Today's path: the Segmentor's bilinear upsampling to the padded size, cropped to the image."""
    return F.interpolate(logits, size=size, mode="bilinear", align_corners=False)[..., :height, :width]


def batch(low: tuple[int, int], image: tuple[int, int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, K, *low, generator=generator, dtype=torch.float64) * 3
    target = torch.randint(0, K - 1, (2, *image), generator=generator)  # class K - 1 absent: Dice's case
    target[torch.rand(target.shape, generator=generator) < 0.2] = IGNORE
    return logits, target


@pytest.mark.parametrize(
    ("low", "size", "crop"),
    [
        ((9, 13), (36, 52), (35, 49)),
        ((5, 7), (37, 50), (37, 50)),
        ((8, 8), (8, 8), (7, 8)),
        ((3, 4), (64, 9), (64, 9)),
    ],
)
def test_bilinear_rows_are_rows_of_interpolate(low, size, crop) -> None:
    logits = torch.randn(2, 3, *low, dtype=torch.float64)
    expected = upsampled(logits, size, *crop)
    for start, stop in ((0, 1), (0, crop[0]), (crop[0] // 3, crop[0] - 1), (crop[0] - 1, crop[0])):
        got = bilinear_rows(logits, size, start, stop, crop[1])
        torch.testing.assert_close(got, expected[:, :, start:stop], rtol=1e-12, atol=1e-12)


LOSSES = {
    "ce": {},
    "ce+dice": {"dice": 1.0},
    "dice over every class": {"ce": 0.0, "dice": 1.0, "dice_present_only": False},
    "weighted, smoothed ce + dice": {
        "ce": 0.7,
        "dice": 0.5,
        "class_weights": [1.0, 2.5, 0.3, 4.0],
        "label_smoothing": 0.1,
    },
}


@pytest.mark.parametrize("options", LOSSES.values(), ids=LOSSES.keys())
@pytest.mark.parametrize("chunk_rows", [1, 7, 1000])
def test_chunked_loss_equals_the_loss_on_upsampled_logits_in_float64(options, chunk_rows) -> None:
    low, size, (height, width) = (10, 13), (40, 52), (38, 49)
    logits, target = batch(low, (height, width))
    criterion = SegLoss(K, ignore_index=IGNORE, **options).double()
    reference_logits = logits.clone().requires_grad_()
    expected = criterion(upsampled(reference_logits, size, height, width), target)
    expected.backward()
    chunked_logits = logits.clone().requires_grad_()
    got = chunked_seg_loss(criterion, chunked_logits, target, size, chunk_rows)
    got.backward()
    assert got.dtype == expected.dtype == torch.float64
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(chunked_logits.grad, reference_logits.grad, rtol=1e-10, atol=1e-12)


def test_bfloat16_logits_are_scored_in_float32() -> None:
    """Half-precision logits are upcast row by row: the loss is float32, within bfloat16's rounding of the
    float64 reference, and the gradient has the logits' dtype."""
    logits, target = batch((10, 13), (38, 49))
    criterion = SegLoss(K, dice=1.0, ignore_index=IGNORE)
    expected = criterion.double()(upsampled(logits, (40, 52), 38, 49), target)
    half = logits.bfloat16().requires_grad_()
    got = chunked_seg_loss(criterion.float(), half, target, (40, 52), 7)
    got.backward()
    assert got.dtype == torch.float32 and half.grad.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), expected, rtol=2e-2, atol=0)


def test_a_batch_without_valid_pixels_gives_zero() -> None:
    logits = torch.randn(1, K, 4, 4, dtype=torch.float64, requires_grad=True)
    target = torch.full((1, 16, 16), IGNORE)
    loss = chunked_seg_loss(SegLoss(K, dice=1.0, ignore_index=IGNORE), logits, target, (16, 16), 5)
    loss.backward()
    assert loss.item() == 0 and torch.isfinite(logits.grad).all()


def test_no_full_resolution_tensor_is_kept_for_backward() -> None:
    """Tensors saved for backward outside the recomputed chunks, other than the inputs themselves (which
    the checkpoints hold by reference): per-class sums only, nothing of the image's size."""
    logits, target = batch((16, 16), (64, 64))
    logits.requires_grad_()
    inputs = {logits.untyped_storage().data_ptr(), target.untyped_storage().data_ptr()}
    saved = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.untyped_storage().data_ptr() not in inputs:
            saved.append(tensor.numel())
        return tensor

    criterion = SegLoss(K, dice=1.0, ignore_index=IGNORE).double()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = chunked_seg_loss(criterion, logits, target, (64, 64), 8)
    loss.backward()
    assert saved and max(saved) <= 8 * K  # one [K] sum per chunk at most


@pytest.mark.parametrize(
    "options",
    [{"lovasz": 1.0}, {"ohem_thresh": 0.7}, {"chunk_rows": 0}, {"chunk_rows": 2.5}],
)
def test_unsupported_combinations_are_refused_when_the_loss_is_built(options) -> None:
    with pytest.raises(ValueError, match=re.escape("loss.chunk_rows")):
        SegLoss(K, **{"chunk_rows": 8, **options})


@pytest.mark.parametrize("aux", [False, True])
def test_training_losses_match_with_and_without_chunks(aux) -> None:
    """``SegmentationModule.head_losses`` on a tiny PVT (odd image size: padded, then cropped), main and
    auxiliary head, both paths with the same weights and inputs."""
    model = tiny_pvt(aux).double()
    images = torch.randn(2, 3, 45, 70, dtype=torch.float64)
    masks = torch.randint(0, 3, (2, 45, 70))
    results = []
    for chunk_rows in (None, 16):
        model.zero_grad()
        holder = type("Holder", (), {})()
        holder.model, holder.criterion = model, SegLoss(3, dice=1.0, chunk_rows=chunk_rows).double()
        holder.kernel_backend = kernel_backend()  # what SegmentationModule reads when it is built
        loss, aux_loss = SegmentationModule.head_losses(holder, images, masks)
        assert (aux_loss is not None) == aux
        (loss + (aux_loss if aux else 0)).backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (plain, plain_grads), (chunked, chunked_grads) = results
    torch.testing.assert_close(chunked, plain, rtol=1e-12, atol=1e-12)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(chunked_grads[name], grad, rtol=1e-9, atol=1e-12, msg=name)


def test_chunked_loss_with_lovasz_fails_before_training(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(train, "build_loggers", pytest.fail)
    cfg = compose_run(tmp_path, *BASE, *TINY_MODEL["pvt"], "loss=lovasz", "loss.chunk_rows=16")
    with pytest.raises(ValueError, match=re.escape("loss.chunk_rows=16 with loss.lovasz=1.0")):
        train.run(cfg)


def test_one_training_step_with_chunked_loss(tmp_path) -> None:
    cfg = compose_run(tmp_path, *BASE, *TINY_MODEL["pvt"], "loss=ce_dice", "loss.chunk_rows=8", "debug=fdr")
    assert train.run(cfg)["steps"] == 1
