"""The training loss from the heads' low-resolution logits, in row chunks recomputed in backward
(``loss.chunk_rows``).

The plain path upsamples the logits [B, K, H/4, W/4] bilinearly to the (stride-padded) image, crops them
and scores them with ``SegLoss``: full-resolution logits of every class, their float32 copy, the log-softmax
and, in backward, their gradients, each B·K·H·W values (1.2 GiB apiece at 4096² with 19 classes). Cross
entropy and Dice are sums over pixels (cross entropy's weighted sum and weight sum; Dice's per-class
intersection, prediction and label sums), so they add up over rows. Each chunk of ``chunk_rows`` output
rows is upsampled from the two low-resolution rows around each of its rows, scored to its sums, and
dropped; ``torch.utils.checkpoint`` recomputes it in backward. At most one chunk's [B, K, chunk_rows, W]
tensors exist at a time. Lovász and OHEM rank all pixels at once and are refused (``check_chunk_rows``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from .losses import SegLoss, at_least_float32, cross_entropy_sums, dice_sums, loss_from_sums


def bilinear_rows(logits: Tensor, size: tuple[int, int], start: int, stop: int, width: int) -> Tensor:
    """Rows [start, stop) and columns [0, width) of ``F.interpolate(logits, size, mode="bilinear",
    align_corners=False)``, reading only the input rows they need; logits [B, K, h, w] → [B, K, rows, width],
    in at least float32 (half-precision logits are upcast row by row, as the loss would upcast them).

    Rows follow PyTorch's source index (dst + 0.5)·h/H − 0.5, clamped at 0, between its floor and the next
    row (the last row repeated); columns are then interpolated by ``F.interpolate`` at an unchanged height,
    which is exact in that direction.
    """
    in_height, in_width = logits.shape[-2:]
    out_height, out_width = size
    if in_height == out_height:
        rows = at_least_float32(logits[:, :, start:stop])
    else:
        dst = torch.arange(start, stop, dtype=torch.float64, device=logits.device)
        src = ((dst + 0.5) * (in_height / out_height) - 0.5).clamp_min(0)
        lower = src.floor().long().clamp_max(in_height - 1)
        upper = (lower + 1).clamp_max(in_height - 1)
        below, above = (at_least_float32(logits.index_select(2, index)) for index in (lower, upper))
        frac = (src - lower).clamp(0, 1).to(below.dtype)[:, None]  # [rows, 1]
        rows = below * (1 - frac) + above * frac
    if in_width != out_width:
        rows = F.interpolate(rows, size=(stop - start, out_width), mode="bilinear", align_corners=False)
    return rows[..., :width]


def chunk_sums(
    criterion: SegLoss, logits: Tensor, target: Tensor, size: tuple[int, int], start: int, stop: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Rows [start, stop) of the upsampled logits scored against ``target``'s: (cross-entropy sum, its
    weight sum, Dice intersection, prediction and label sums per class); zeros for a term that is off."""
    rows = bilinear_rows(logits, size, start, stop, target.shape[-1])  # [B, K, stop - start, W]
    target_rows = target[:, start:stop]
    zero = rows.new_zeros((), dtype=torch.float)
    ce_sum = ce_weight = intersection = predicted = labelled = zero
    if criterion.ce:
        ce_sum, ce_weight = cross_entropy_sums(
            at_least_float32(rows),
            target_rows,
            criterion.ignore_index,
            criterion.class_weights,
            criterion.label_smoothing,
        )
    if criterion.dice:
        intersection, predicted, labelled = dice_sums(rows, target_rows, criterion.ignore_index)
    return ce_sum, ce_weight, intersection, predicted, labelled


def chunked_seg_loss(
    criterion: SegLoss, logits: Tensor, target: Tensor, size: tuple[int, int], chunk_rows: int | None = None
) -> Tensor:
    """``criterion(F.interpolate(logits, size, mode="bilinear")[..., :H, :W], target)`` for target
    [B, H, W] and ``size`` ≥ (H, W) (the padded image the head's ``logits`` cover), computed in chunks of
    ``chunk_rows`` rows (default ``criterion.chunk_rows``) that are recomputed in backward."""
    chunk_rows = chunk_rows or criterion.chunk_rows
    if not chunk_rows:
        raise ValueError("chunked_seg_loss: no chunk_rows given and loss.chunk_rows is null")
    check_covers("chunked_seg_loss", criterion, size, target)
    height = target.shape[-2]
    recompute = torch.is_grad_enabled() and logits.requires_grad
    chunks = []
    for start in range(0, height, chunk_rows):
        args = (criterion, logits, target, size, start, min(start + chunk_rows, height))
        chunks.append(checkpoint(chunk_sums, *args, use_reentrant=False) if recompute else chunk_sums(*args))
    return loss_from_sums(criterion, *(torch.stack(part).sum(0) for part in zip(*chunks, strict=True)))


def check_covers(caller: str, criterion: SegLoss, size: tuple[int, int], target: Tensor) -> None:
    """Refuse a criterion with a term that is not a sum over pixels, or logits covering less than the mask
    (a ValueError naming ``caller``)."""
    if not criterion.sums_over_pixels:
        raise ValueError(f"{caller}: Lovász and OHEM need all pixels at once (loss.chunk_rows=null)")
    height, width = target.shape[-2:]
    if size[0] < height or size[1] < width:
        raise ValueError(
            f"{caller}: logits cover {size[0]}×{size[1]} px, less than the mask's {height}×{width}"
        )
