"""Whole-image and sliding-window inference with optional multi-scale and flip test-time augmentation.

Slide mode keeps memory bounded for any image size: the model never sees more than ``crop_batch_size``
crops at once; the full-size logits and a per-pixel count map are the only image-sized tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..images import as_hw
from ..tiling import INFERENCE_DEFAULTS, MODES, Window, default_stride, scaled_size, slide_windows


def _check_logits(logits: Tensor, images: Tensor, num_classes: int) -> Tensor:
    expected = (images.shape[0], num_classes, *images.shape[-2:])
    if tuple(logits.shape) != expected:
        raise ValueError(
            f"infer: model returned logits of shape {list(logits.shape)} for input {list(images.shape)}; "
            f"expected {list(expected)} (num_classes={num_classes}, logits at input resolution)"
        )
    return logits


def infer_whole(model: Callable[[Tensor], Tensor], images: Tensor, num_classes: int) -> Tensor:
    """One forward pass over the full images."""
    return _check_logits(model(images), images, num_classes)


Job = tuple[int, Window]  # (image index in the batch, window)


def slide_batches(
    model: Callable[[Tensor], Tensor],
    crops_of: Callable[[list[Job]], Tensor],
    jobs: list[Job],
    num_classes: int,
    crop_batch_size: int,
    start: int = 0,
) -> Iterator[tuple[list[Job], Tensor]]:
    """(jobs, fp32 logits [n, K, h, w]) for ``jobs[start:]``, ``crop_batch_size`` crops per forward pass.

    The one batching every slide path shares (in-memory ``infer_slide`` and the strip-by-strip raster
    stream), so both see the same crops in the same batches and sum the same numbers in the same order.
    ``start`` must be a multiple of ``crop_batch_size`` for the batches to line up.
    """
    if crop_batch_size < 1:
        raise ValueError(f"infer: crop_batch_size={crop_batch_size}; expected >= 1")
    for begin in range(start, len(jobs), crop_batch_size):
        chunk = jobs[begin : begin + crop_batch_size]
        crops = crops_of(chunk)
        yield chunk, _check_logits(model(crops), crops, num_classes).float()


def infer_slide(
    model: Callable[[Tensor], Tensor],
    images: Tensor,
    num_classes: int,
    crop: tuple[int, int],
    stride: tuple[int, int],
    crop_batch_size: int = INFERENCE_DEFAULTS["crop_batch_size"],
) -> Tensor:
    """Overlapping crops batched ``crop_batch_size`` at a time; overlaps averaged with a count map."""
    batch, _, height, width = images.shape
    windows = slide_windows(height, width, crop, stride)
    jobs = [(index, window) for index in range(batch) for window in windows]
    logits = images.new_zeros((batch, num_classes, height, width), dtype=torch.float32)
    count = images.new_zeros((1, 1, height, width), dtype=torch.float32)
    for top, bottom, left, right in windows:
        count[..., top:bottom, left:right] += 1

    def crops_of(chunk: list[Job]) -> Tensor:
        return torch.stack([images[i, :, top:bottom, left:right] for i, (top, bottom, left, right) in chunk])

    for chunk, out in slide_batches(model, crops_of, jobs, num_classes, crop_batch_size):
        for crop_logits, (i, (top, bottom, left, right)) in zip(out, chunk, strict=True):
            logits[i, :, top:bottom, left:right] += crop_logits
    return logits / count


@torch.no_grad()
def infer(
    model: Callable[[Tensor], Tensor],
    images: Tensor,
    num_classes: int,
    mode: str = INFERENCE_DEFAULTS["mode"],
    crop: int | Sequence[int] | None = None,
    stride: int | Sequence[int] | None = None,
    crop_batch_size: int = INFERENCE_DEFAULTS["crop_batch_size"],
    scales: Sequence[float] = tuple(INFERENCE_DEFAULTS["scales"]),
    flip: bool = INFERENCE_DEFAULTS["flip"],
) -> Tensor:
    """Logits [B, K, H, W] at the size of ``images`` [B, 3, H, W]; runs without autograd. The options are
    the keys of the ``inference`` config group, so ``infer(model, images, K, **inference)`` runs it.

    ``slide`` needs ``crop`` (stride defaults to half the crop). With several ``scales`` or ``flip``,
    each view's logits are resized (bilinear) back to H × W, un-flipped, and averaged.
    """
    if mode not in MODES:
        raise ValueError(f"infer: mode={mode!r}; expected one of {MODES}")
    if images.dim() != 4:
        raise ValueError(f"infer: images of shape {list(images.shape)}; expected [B, 3, H, W]")
    if not scales:
        raise ValueError("infer: scales is empty; expected at least one scale, e.g. (1.0,)")
    if mode == "slide":
        if crop is None:
            raise ValueError("infer: mode='slide' needs crop (int or (height, width))")
        window = as_hw(crop, "crop")
        step = default_stride(window) if stride is None else as_hw(stride, "stride")

        def run(x: Tensor) -> Tensor:
            return infer_slide(model, x, num_classes, window, step, crop_batch_size)

    else:

        def run(x: Tensor) -> Tensor:
            return infer_whole(model, x, num_classes)

    height, width = images.shape[-2:]
    if tuple(scales) == (1.0,) and not flip:
        return run(images)
    total = images.new_zeros((images.shape[0], num_classes, height, width), dtype=torch.float32)
    for scale in scales:
        size = scaled_size(height, width, scale)
        scaled = images if size == (height, width) else F.interpolate(images, size, mode="bilinear")
        views = [run(scaled).float()]
        if flip:
            views.append(run(scaled.flip(-1)).float().flip(-1))
        for view in views:
            same_size = size == (height, width)
            total += view if same_size else F.interpolate(view, (height, width), mode="bilinear")
    return total / (len(scales) * (2 if flip else 1))


__all__ = ["MODES", "Job", "infer", "infer_slide", "infer_whole", "slide_batches"]
