"""Triton kernels of the fused training loss (``fused_loss``): the heads' logits [B, K, h, w] upsampled
bilinearly to the image in registers, scored by cross entropy and Dice, never written at full resolution.

Upsampling follows per output row and column the tables ``fused_loss.axis_table`` computes (PyTorch's
align_corners=False rule: the lower source index, the upper one and the upper one's weight); every value
is computed in fp32 whatever the logits' dtype (fp32, bf16, fp16, read through their strides).

- ``loss_sums_kernel``: grid (image rows, spans of ``span`` columns, B); each program scores its span of
  one row of the mask, a block of ``BLOCK`` columns at a time, and writes its partial sums: the
  cross-entropy sum and its weight sum, and with ``DICE`` Dice's per-class intersection, prediction and
  label sums ([2 + 3K] per program; the caller adds them up, in a fixed order).
- ``loss_backward_kernel``: grid (low-resolution rows, blocks of ``BLOCK_IN`` low-resolution columns, B);
  ∂logits of one block, gathered from the output pixels that read it (the rows and columns in the tables'
  ranges): the softmax recomputed there, each pixel's ∂(upsampled logits) weighed by its bilinear weights
  and summed, a ``tl.dot`` with the column weights. No atomics: deterministic. Each output pixel feeds two
  low-resolution rows and up to two blocks, so its softmax is computed up to four times in backward.
  (One program per low-resolution row, walking all its blocks, took 25 ms at 4096² on an H200: too few
  programs for the work; docs/performance.md.)

Classes are padded to the power of two ``KP`` (at least 16, what ``tl.dot`` needs) and masked.
TRITON_INTERPRET=1 runs them on the CPU, with the attention kernels' rule (``attention.triton.kernels``,
imported first: it refuses a setting that changed after triton was imported).
"""

# ruff: noqa: N803  (upper case: Triton's convention for compile-time constants)

from __future__ import annotations

import triton
import triton.language as tl

from ..attention.triton.kernels import INTERPRETED

__all__ = ["INTERPRETED", "loss_backward_kernel", "loss_sums_kernel"]


@triton.jit
def upsampled_logits(
    logits_ptr, slk, slh, slw, classes, classes_ok, top, bottom, vertical, cols_ok, left, right, horizontal
):
    """[KP, BLOCK] fp32 logits at one output row (source rows ``top``, ``bottom``, the bottom's weight
    ``vertical``) and a block of columns (``left``, ``right``, ``horizontal`` per column); padded classes
    −inf, masked columns 0."""
    mask = classes_ok[:, None] & cols_ok[None, :]
    base = logits_ptr + classes[:, None].to(tl.int64) * slk
    top_row, bottom_row = base + top.to(tl.int64) * slh, base + bottom.to(tl.int64) * slh
    left_col, right_col = left[None, :].to(tl.int64) * slw, right[None, :].to(tl.int64) * slw
    right_weight = horizontal[None, :]
    left_weight = 1.0 - right_weight
    upper = left_weight * tl.load(top_row + left_col, mask=mask, other=0.0).to(tl.float32)
    upper += right_weight * tl.load(top_row + right_col, mask=mask, other=0.0).to(tl.float32)
    lower = left_weight * tl.load(bottom_row + left_col, mask=mask, other=0.0).to(tl.float32)
    lower += right_weight * tl.load(bottom_row + right_col, mask=mask, other=0.0).to(tl.float32)
    z = (1.0 - vertical) * upper + vertical * lower
    return tl.where(classes_ok[:, None], z, float("-inf"))


@triton.jit
def softmax_columns(z):
    """The softmax over classes (axis 0) of ``z`` [KP, BLOCK] and its log-sum-exp per column."""
    top = tl.max(z, axis=0)
    e = tl.exp(z - top[None, :])
    total = tl.sum(e, axis=0)
    return e / total[None, :], top + tl.log(total)


@triton.jit(do_not_specialize=("H", "W", "span"))
def loss_sums_kernel(
    logits_ptr, target_ptr, weight_ptr, sums_ptr,
    row_low_ptr, row_high_ptr, row_frac_ptr, col_low_ptr, col_high_ptr, col_frac_ptr,
    slb, slk, slh, slw, stb, sth, stw,
    H, W, K, ignore_index, smoothing, span,
    DICE: tl.constexpr, KP: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    # Per pixel with target t: (1 − ε)·w_t·(lse − z_t) + ε/K·Σ_k w_k·(lse − z_k) (F.cross_entropy's label
    # smoothing), weight w_t; Dice: p·onehot, p, onehot per class, all over valid pixels only.
    y, part, b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    classes = tl.arange(0, KP)
    classes_ok = classes < K
    weights = tl.load(weight_ptr + classes, mask=classes_ok, other=0.0)
    top, bottom = tl.load(row_low_ptr + y), tl.load(row_high_ptr + y)
    vertical = tl.load(row_frac_ptr + y)
    ce = tl.zeros([BLOCK], dtype=tl.float32)
    weight_sum = tl.zeros([BLOCK], dtype=tl.float32)
    intersection = tl.zeros([KP], dtype=tl.float32)
    predicted = tl.zeros([KP], dtype=tl.float32)
    labelled = tl.zeros([KP], dtype=tl.float32)
    logits_base, target_base = logits_ptr + b * slb, target_ptr + b * stb + y.to(tl.int64) * sth
    stop = tl.minimum(part * span + span, W)
    for start in range(part * span, stop, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        cols_ok = cols < stop
        left = tl.load(col_low_ptr + cols, mask=cols_ok, other=0)
        right = tl.load(col_high_ptr + cols, mask=cols_ok, other=0)
        horizontal = tl.load(col_frac_ptr + cols, mask=cols_ok, other=0.0)
        z = upsampled_logits(
            logits_base, slk, slh, slw, classes, classes_ok, top, bottom, vertical, cols_ok, left, right,
            horizontal,
        )  # fmt: skip
        target = tl.load(target_base + cols.to(tl.int64) * stw, mask=cols_ok, other=ignore_index)
        valid = cols_ok & (target != ignore_index)
        onehot = (classes[:, None] == target[None, :]) & valid[None, :]
        p, lse = softmax_columns(z)
        nll = tl.where(classes_ok[:, None], lse[None, :] - z, 0.0)
        pixel_weight = tl.sum(tl.where(onehot, weights[:, None], 0.0), axis=0)
        true_nll = tl.sum(tl.where(onehot, nll, 0.0), axis=0)
        smooth = tl.sum(weights[:, None] * nll, axis=0)
        loss = (1.0 - smoothing) * pixel_weight * true_nll + smoothing / K * smooth
        ce += tl.where(valid, loss, 0.0)
        weight_sum += pixel_weight
        if DICE:
            p = tl.where(valid[None, :], p, 0.0)
            intersection += tl.sum(tl.where(onehot, p, 0.0), axis=1)
            predicted += tl.sum(p, axis=1)
            labelled += tl.sum(onehot.to(tl.float32), axis=1)
    base = sums_ptr + ((b * tl.num_programs(0) + y) * tl.num_programs(1) + part) * (2 + 3 * K)
    tl.store(base, tl.sum(ce, axis=0))
    tl.store(base + 1, tl.sum(weight_sum, axis=0))
    if DICE:
        tl.store(base + 2 + classes, intersection, mask=classes_ok)
        tl.store(base + 2 + K + classes, predicted, mask=classes_ok)
        tl.store(base + 2 + 2 * K + classes, labelled, mask=classes_ok)


@triton.jit(do_not_specialize=("H", "W", "w"))
def loss_backward_kernel(
    logits_ptr, target_ptr, weight_ptr, grad_ptr, dlogits_ptr,
    row_low_ptr, row_high_ptr, row_frac_ptr, col_low_ptr, col_high_ptr, col_frac_ptr,
    row_start_ptr, row_stop_ptr, col_start_ptr, col_stop_ptr,
    slb, slk, slh, slw, stb, sth, stw, sdb, sdk, sdh, sdw,
    H, W, w, K, ignore_index, smoothing,
    DICE: tl.constexpr, KP: tl.constexpr, BLOCK: tl.constexpr, BLOCK_IN: tl.constexpr,
):  # fmt: skip
    # ∂z_k per valid pixel, with g the gradients of the sums and p the softmax: cross entropy's
    # g_ce·((1 − ε)·w_t·(p_k − [k = t]) + ε/K·(Σw·p_k − w_k)), Dice's p_k·(a_k − Σ_j p_j a_j) with
    # a_k = g_I,k·[k = t] + g_P,k; ∂logits[i, j] = Σ over output pixels of ∂z·(i's row weight)·(j's column
    # weight).
    i, block_start, b = tl.program_id(0), tl.program_id(1) * BLOCK_IN, tl.program_id(2).to(tl.int64)
    classes = tl.arange(0, KP)
    classes_ok = classes < K
    weights = tl.load(weight_ptr + classes, mask=classes_ok, other=0.0)
    total_weight = tl.sum(weights, axis=0)
    grad_ce = tl.load(grad_ptr)
    grad_intersection = tl.load(grad_ptr + 2 + classes, mask=classes_ok, other=0.0)
    grad_predicted = tl.load(grad_ptr + 2 + K + classes, mask=classes_ok, other=0.0)
    row_start, row_stop = tl.load(row_start_ptr + i), tl.minimum(tl.load(row_stop_ptr + i), H)
    logits_base, target_base = logits_ptr + b * slb, target_ptr + b * stb
    inputs = block_start + tl.arange(0, BLOCK_IN)
    last = tl.minimum(block_start + BLOCK_IN, w) - 1
    col_start = tl.load(col_start_ptr + block_start)
    col_stop = tl.minimum(tl.load(col_stop_ptr + last), W)
    acc = tl.zeros([KP, BLOCK_IN], dtype=tl.float32)
    for y in range(row_start, row_stop):
        top, bottom = tl.load(row_low_ptr + y), tl.load(row_high_ptr + y)
        vertical = tl.load(row_frac_ptr + y)
        row_weight = tl.where(top == i, 1.0 - vertical, 0.0) + tl.where(bottom == i, vertical, 0.0)
        for start in range(col_start, col_stop, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            cols_ok = cols < col_stop
            left = tl.load(col_low_ptr + cols, mask=cols_ok, other=-1)
            right = tl.load(col_high_ptr + cols, mask=cols_ok, other=-1)
            horizontal = tl.load(col_frac_ptr + cols, mask=cols_ok, other=0.0)
            z = upsampled_logits(
                logits_base, slk, slh, slw, classes, classes_ok, top, bottom, vertical, cols_ok,
                left, right, horizontal,
            )  # fmt: skip
            target_row = target_base + tl.cast(y, tl.int64) * sth
            target = tl.load(target_row + cols.to(tl.int64) * stw, mask=cols_ok, other=ignore_index)
            valid = cols_ok & (target != ignore_index)
            onehot = classes[:, None] == target[None, :]
            p, _ = softmax_columns(z)
            pixel_weight = tl.sum(tl.where(onehot, weights[:, None], 0.0), axis=0)
            dz = (1.0 - smoothing) * pixel_weight[None, :] * (p - onehot.to(tl.float32))
            dz += smoothing / K * (total_weight * p - weights[:, None])
            dz *= grad_ce
            if DICE:
                a = tl.where(onehot, grad_intersection[:, None], 0.0) + grad_predicted[:, None]
                dz += p * (a - tl.sum(p * a, axis=0)[None, :])
            dz = tl.where(classes_ok[:, None] & valid[None, :], dz * row_weight, 0.0)
            spread = tl.where(left[:, None] == inputs[None, :], 1.0 - horizontal[:, None], 0.0)
            spread += tl.where(right[:, None] == inputs[None, :], horizontal[:, None], 0.0)
            acc += tl.dot(dz, spread, input_precision="ieee")
    offsets = dlogits_ptr + b * sdb + classes[:, None].to(tl.int64) * sdk + i.to(tl.int64) * sdh
    mask = classes_ok[:, None] & (inputs < w)[None, :]
    offsets += inputs[None, :].to(tl.int64) * sdw
    tl.store(offsets, acc.to(dlogits_ptr.dtype.element_ty), mask=mask)
