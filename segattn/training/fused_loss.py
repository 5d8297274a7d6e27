"""The training loss as one fused Triton operator on the heads' own-resolution logits (``fused_seg_loss``):
what ``chunked_loss.chunked_seg_loss`` computes, without a full-resolution tensor in memory or in traffic.

The forward operator ``segattn::seg_loss_sums`` reads the logits [B, K, h, w] (fp32, bf16 or fp16) and
the mask [B, H, W] once, upsamples the K logits of each mask pixel in registers (PyTorch's bilinear
align_corners=False rule, from the padded image's size) and returns the pixel sums cross entropy and Dice
are made of: [cross-entropy sum, weight sum, Dice intersection (K), prediction (K), labels (K)], fp32.
Its backward operator ``segattn::seg_loss_sums_backward`` recomputes the softmax at each pixel and writes
∂logits at the logits' own resolution (``loss_kernels``); nothing but the inputs is kept for backward.
Lovász and OHEM rank all pixels at once and keep the upsampled path (``SegLoss.sums_over_pixels``);
which calls take this path is ``layers.loss_path``'s decision (SEGATTN_KERNEL=triton or loss: on an H200 its
backward was slower than the upsampled loss it replaces; docs/performance.md).
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType

import torch
from torch import Tensor
from torch.library import custom_op, register_fake

from .chunked_loss import check_covers
from .losses import SegLoss, loss_from_sums

MIN_CLASSES = 16  # classes are padded to a power of two of at least this (``tl.dot``'s smallest operand)
# (padded classes) × columns per 4 warps of a block: 2048 spilled registers in the backward on sm_90
# (tests/attention/test_triton_compile.py, ptxas's report); wider classes get more warps
VALUES_PER_4_WARPS = 512
BLOCK_IN = 32  # low-resolution columns per backward program (16 spilled 32 bytes at 19 classes on sm_90)
SPAN_BLOCKS = 16  # blocks of output columns per forward program (1 under the interpreter: spans get crossed)


@functools.cache
def loss_kernels() -> ModuleType:
    """``loss_kernels``, imported on first use (triton is not needed before)."""
    return importlib.import_module(f"{__package__}.loss_kernels")


def loss_blocks(classes: int) -> tuple[int, int, int]:
    """Padded classes, output columns per block and warps for ``classes`` classes."""
    padded = max(MIN_CLASSES, 1 << (classes - 1).bit_length())
    block = max(16, VALUES_PER_4_WARPS // padded)
    return padded, block, 4 * padded * block // VALUES_PER_4_WARPS


def axis_table(low: int, size: int, device: torch.device) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Bilinear upsampling from ``low`` to ``size`` along one axis (align_corners=False, as
    ``F.interpolate``): per output index its lower and upper source index (int32) and the upper one's
    weight (fp32); per source index the first and one past the last output index that reads it."""
    scale = torch.tensor(low / size, dtype=torch.float32)
    source = ((torch.arange(size, device=device, dtype=torch.float32) + 0.5) * scale - 0.5).clamp_min(0)
    lower = source.long().clamp_max(low - 1)  # truncation: the source index is at least 0
    upper = (lower + 1).clamp_max(low - 1)
    fraction = source - lower
    # source index j is read by the outputs whose lower index is j − 1 or j (lower is non-decreasing)
    first = torch.searchsorted(lower, torch.arange(-1, low + 1, device=device))
    return lower.int(), upper.int(), fraction, first[:-2].int(), first[2:].int()


def tables(logits: Tensor, size: list[int]) -> list[tuple[Tensor, ...]]:
    """``axis_table`` of the rows and of the columns, from ``logits`` [B, K, h, w] to ``size``."""
    return [axis_table(low, side, logits.device) for low, side in zip(logits.shape[-2:], size, strict=True)]


def sums_length(classes: int) -> int:
    return 2 + 3 * classes


@custom_op("segattn::seg_loss_sums", mutates_args=())
def seg_loss_sums(
    logits: Tensor,
    target: Tensor,
    weights: Tensor,
    size: list[int],
    ignore_index: int,
    smoothing: float,
    dice: bool,
) -> Tensor:
    """The loss sums (see the module) of ``logits`` [B, K, h, w] upsampled to ``size`` and cropped to
    ``target`` [B, H, W]; ``weights``: the K class weights, fp32; Dice's sums are zeros unless ``dice``."""
    (batch, classes), (height, width) = logits.shape[:2], target.shape[-2:]
    rows, cols = (table[:3] for table in tables(logits, size))
    padded, block, warps = loss_blocks(classes)
    span = block * (SPAN_BLOCKS if logits.is_cuda else 1)
    parts = -(-width // span)
    sums = logits.new_zeros(batch, height, parts, sums_length(classes), dtype=torch.float32)
    loss_kernels().loss_sums_kernel[(height, parts, batch)](
        logits, target, weights, sums, *rows, *cols, *logits.stride(), *target.stride(),
        height, width, classes, ignore_index, smoothing, span,
        DICE=dice, KP=padded, BLOCK=block, num_warps=warps,
    )  # fmt: skip
    return sums.sum((0, 1, 2))


@register_fake("segattn::seg_loss_sums")
def _(logits, target, weights, size, ignore_index, smoothing, dice):
    return logits.new_empty(sums_length(logits.shape[1]), dtype=torch.float32)


@custom_op("segattn::seg_loss_sums_backward", mutates_args=())
def seg_loss_sums_backward(
    grad: Tensor,
    logits: Tensor,
    target: Tensor,
    weights: Tensor,
    size: list[int],
    ignore_index: int,
    smoothing: float,
    dice: bool,
) -> Tensor:
    """∂logits (the logits' shape and dtype) from ``grad``, the gradient of ``seg_loss_sums``' result."""
    (batch, classes, low_height, low_width), (height, width) = logits.shape, target.shape[-2:]
    rows, cols = tables(logits, size)
    grad_logits = torch.empty_like(logits)
    padded, block, warps = loss_blocks(classes)
    loss_kernels().loss_backward_kernel[(low_height, -(-low_width // BLOCK_IN), batch)](
        logits, target, weights, grad.float().contiguous(), grad_logits, *rows[:3], *cols[:3], *rows[3:],
        *cols[3:], *logits.stride(), *target.stride(), *grad_logits.stride(),
        height, width, low_width, classes, ignore_index, smoothing,
        DICE=dice, KP=padded, BLOCK=block, BLOCK_IN=BLOCK_IN, num_warps=warps,
    )  # fmt: skip
    return grad_logits


@register_fake("segattn::seg_loss_sums_backward")
def _(grad, logits, target, weights, size, ignore_index, smoothing, dice):
    return torch.empty_like(logits)


def setup(ctx, inputs: tuple, output: Tensor) -> None:
    logits, target, weights, *ctx.settings = inputs
    ctx.save_for_backward(logits, target, weights)


def backward(ctx, grad: Tensor) -> tuple:
    logits, target, weights = ctx.saved_tensors
    grad_logits = torch.ops.segattn.seg_loss_sums_backward(grad, logits, target, weights, *ctx.settings)
    return grad_logits, None, None, None, None, None, None


torch.library.register_autograd("segattn::seg_loss_sums", backward, setup_context=setup)


def fused_seg_loss(criterion: SegLoss, logits: Tensor, target: Tensor, size: tuple[int, int]) -> Tensor:
    """``criterion(F.interpolate(logits, size, mode="bilinear")[..., :H, :W], target)`` for target
    [B, H, W] and ``size`` ≥ (H, W) (the padded image the head's ``logits`` cover), by the fused operator;
    cross entropy and Dice only (``criterion.sums_over_pixels``)."""
    check_covers("fused_seg_loss", criterion, size, target)
    classes = logits.shape[1]
    weights = criterion.class_weights
    weights = torch.ones(classes, device=logits.device) if weights is None else weights.float()
    sums = torch.ops.segattn.seg_loss_sums(
        logits, target, weights.contiguous(), list(size), criterion.ignore_index,
        criterion.label_smoothing, bool(criterion.dice),
    )  # fmt: skip
    return loss_from_sums(criterion, *sums[:2], *sums[2:].view(3, classes))
