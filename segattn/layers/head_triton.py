"""The SegFormer decode head's training step after its fusion conv, BatchNorm (batch statistics) + ReLU + a
1×1 classifier with a weight per image, as Triton operators that never write the normalised map or its
gradient: the fused map x [B, C, H, W] (any strides that flatten H×W into one) is read twice forward and
twice backward, and ∂x written once.

- ``segattn::batch_stats`` (``stats_kernel``): each channel's mean and biased variance in fp32, from
  per-program sums of x − x[0, c, 0] and their squares (shifted, so a mean far from zero cancels nothing).
- ``segattn::norm_relu_classifier`` (``classifier_kernel``): per tile of pixels, y = relu(x̂·γ + β) with
  x̂ = (x − mean)·rstd in registers, one block of channels at a time, and logits = weight_b·y + bias
  (``tl.dot``, classes padded, fp32 accumulation) written in the classifier's dtype (autocast's, else x's).
  Its autograd gives x BatchNorm's batch-statistics gradient: mean and rstd must be x's own, detached.
- ``segattn::norm_relu_classifier_backward`` (``classifier_backward_kernel``): programs per block of
  channels walk an image's pixel blocks, recompute y, ∂y = weight_bᵀ·∂logits, ∂n = ∂y·[y > 0], and keep
  fp32 sums of ∂n, ∂n·x̂ and ∂weight_b = Σ_p ∂logits(p)·y(p)ᵀ, which the caller adds in a fixed order
  (deterministic, no atomics).
- ``segattn::norm_relu_input_grad`` (``input_grad_kernel``): recomputes ∂n per tile and writes
  ∂x = γ·rstd·(∂n − mean(∂n) − x̂·mean(∂n·x̂)).

TRITON_INTERPRET=1 (set before triton is first imported) runs the kernels on the CPU. This module imports
triton, so ``models.heads`` loads it on first use.
"""

# ruff: noqa: N803  (upper case: Triton's convention for compile-time constants)

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor, nn
from torch.library import custom_op, register_autograd, register_fake

from .dtypes import matmul_dtype
from .recompute import reused

PROGRAMS_PER_SM = 4  # the walking kernels' programs per multiprocessor
INTERPRETER_PROGRAMS = 2
NUM_WARPS = 8  # 4 spill at 128 classes


@triton.jit
def tile_offsets(b, channels, pixels, sb, sc, sp, C, P):
    """Offsets and mask of a [channels, pixels] tile of image b in [B, C, P] of strides (sb, sc, sp)."""
    mask = (channels < C)[:, None] & (pixels < P)[None, :]
    offsets = b.to(tl.int64) * sb + channels.to(tl.int64)[:, None] * sc + pixels.to(tl.int64)[None, :] * sp
    return offsets, mask


@triton.jit
def normed_tile(x_ptr, mean_ptr, rstd_ptr, gamma_ptr, beta_ptr, b, channels, pixels, sxb, sxc, sxp, C, P):
    """(y, x̂) of a [channels, pixels] tile in fp32: x̂ = (x − mean)·rstd, y = relu(x̂·γ + β), 0 outside x."""
    offsets, mask = tile_offsets(b, channels, pixels, sxb, sxc, sxp, C, P)
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    ok = channels < C
    mean = tl.load(mean_ptr + channels, mask=ok, other=0.0)
    rstd = tl.load(rstd_ptr + channels, mask=ok, other=0.0)
    gamma = tl.load(gamma_ptr + channels, mask=ok, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + channels, mask=ok, other=0.0).to(tl.float32)
    normed = (x - mean[:, None]) * rstd[:, None]
    y = tl.where(mask, tl.maximum(normed * gamma[:, None] + beta[:, None], 0.0), 0.0)
    return y, normed


@triton.jit
def dot_operand(t, dtype, COMPILED: tl.constexpr):
    """t rounded to ``dtype``, the dots' input type; held in fp32 under the interpreter, whose bf16 dot
    reads the bits wrong."""
    t = t.to(dtype)
    if not COMPILED:
        t = t.to(tl.float32)
    return t


@triton.jit
def class_tile(ptr, b, classes, columns, K, N, dtype, COMPILED: tl.constexpr):
    """[classes, columns] of image b in a contiguous [B, K, N] tensor as a ``dot_operand``, 0 outside it."""
    mask = (classes < K)[:, None] & (columns < N)[None, :]
    offsets = (b * K + classes).to(tl.int64)[:, None] * N + columns[None, :]
    return dot_operand(tl.load(ptr + offsets, mask=mask, other=0.0), dtype, COMPILED)


@triton.jit
def stats_kernel(
    x_ptr, shift_ptr, part_ptr, sxb, sxc, sxp, C, P, pixel_blocks,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    channel_block, program, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    programs = tl.num_programs(1)
    channels = channel_block * BLOCK_C + tl.arange(0, BLOCK_C)
    shift = tl.load(shift_ptr + channels, mask=channels < C, other=0.0)
    sums = tl.zeros([BLOCK_C], dtype=tl.float32)
    squares = tl.zeros([BLOCK_C], dtype=tl.float32)
    for block in range(program, pixel_blocks, programs):
        pixels = block * BLOCK_P + tl.arange(0, BLOCK_P)
        offsets, mask = tile_offsets(b, channels, pixels, sxb, sxc, sxp, C, P)
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        shifted = tl.where(mask, x - shift[:, None], 0.0)
        sums += tl.sum(shifted, axis=1)
        squares += tl.sum(shifted * shifted, axis=1)
    part = part_ptr + ((b * programs + program) * 2) * C + channels
    tl.store(part, sums, mask=channels < C)
    tl.store(part + C, squares, mask=channels < C)


@triton.jit
def classifier_kernel(
    x_ptr, mean_ptr, rstd_ptr, gamma_ptr, beta_ptr, w_ptr, bias_ptr, out_ptr, sxb, sxc, sxp, C, K, P,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr,
    COMPILED: tl.constexpr,
):  # fmt: skip
    pixels = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    b = tl.program_id(1)
    classes = tl.arange(0, BLOCK_K)
    dtype = out_ptr.dtype.element_ty
    acc = tl.zeros([BLOCK_K, BLOCK_P], dtype=tl.float32)
    for start in range(0, C, BLOCK_C):
        channels = start + tl.arange(0, BLOCK_C)
        y, _ = normed_tile(
            x_ptr, mean_ptr, rstd_ptr, gamma_ptr, beta_ptr, b, channels, pixels, sxb, sxc, sxp, C, P
        )
        w = class_tile(w_ptr, b, classes, channels, K, C, dtype, COMPILED)
        acc += tl.dot(w, dot_operand(y, dtype, COMPILED), input_precision="ieee")
    acc += tl.load(bias_ptr + classes, mask=classes < K, other=0.0).to(tl.float32)[:, None]
    offsets = (b * K + classes).to(tl.int64)[:, None] * P + pixels[None, :]
    tl.store(out_ptr + offsets, acc.to(dtype), mask=(classes < K)[:, None] & (pixels < P)[None, :])


@triton.jit
def classifier_backward_kernel(
    grad_ptr, x_ptr, mean_ptr, rstd_ptr, gamma_ptr, beta_ptr, w_ptr, part_ptr, dw_ptr, sxb, sxc, sxp,
    C, K, P, pixel_blocks, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr,
    COMPILED: tl.constexpr,
):  # fmt: skip
    channel_block, program, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    programs = tl.num_programs(1)
    channels = channel_block * BLOCK_C + tl.arange(0, BLOCK_C)
    classes = tl.arange(0, BLOCK_K)
    dtype = grad_ptr.dtype.element_ty
    w_t = tl.trans(class_tile(w_ptr, b, classes, channels, K, C, dtype, COMPILED))  # [channels, classes]
    sum_dn = tl.zeros([BLOCK_C], dtype=tl.float32)
    sum_dn_normed = tl.zeros([BLOCK_C], dtype=tl.float32)
    grad_w = tl.zeros([BLOCK_K, BLOCK_C], dtype=tl.float32)
    for block in range(program, pixel_blocks, programs):
        pixels = block * BLOCK_P + tl.arange(0, BLOCK_P)
        y, normed = normed_tile(
            x_ptr, mean_ptr, rstd_ptr, gamma_ptr, beta_ptr, b, channels, pixels, sxb, sxc, sxp, C, P
        )
        grad = class_tile(grad_ptr, b, classes, pixels, K, P, dtype, COMPILED)
        dn = tl.where(y > 0, tl.dot(w_t, grad, input_precision="ieee"), 0.0)
        sum_dn += tl.sum(dn, axis=1)
        sum_dn_normed += tl.sum(dn * normed, axis=1)
        grad_w += tl.dot(grad, tl.trans(dot_operand(y, dtype, COMPILED)), input_precision="ieee")
    ok = channels < C
    part = part_ptr + ((b * programs + program) * 2) * C + channels
    tl.store(part, sum_dn, mask=ok)
    tl.store(part + C, sum_dn_normed, mask=ok)
    offsets = ((b * programs + program) * K + classes).to(tl.int64)[:, None] * C + channels[None, :]
    tl.store(dw_ptr + offsets, grad_w, mask=(classes < K)[:, None] & ok[None, :])


@triton.jit
def input_grad_kernel(
    grad_ptr, x_ptr, mean_ptr, rstd_ptr, gamma_ptr, beta_ptr, w_ptr, coef_ptr, dx_ptr, sxb, sxc, sxp,
    sdb, sdc, sdp, C, K, P, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr,
    COMPILED: tl.constexpr,
):  # fmt: skip
    pixels = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    b = tl.program_id(1)
    classes = tl.arange(0, BLOCK_K)
    dtype = grad_ptr.dtype.element_ty
    grad = class_tile(grad_ptr, b, classes, pixels, K, P, dtype, COMPILED)
    for start in range(0, C, BLOCK_C):
        channels = start + tl.arange(0, BLOCK_C)
        y, normed = normed_tile(
            x_ptr, mean_ptr, rstd_ptr, gamma_ptr, beta_ptr, b, channels, pixels, sxb, sxc, sxp, C, P
        )
        w_t = tl.trans(class_tile(w_ptr, b, classes, channels, K, C, dtype, COMPILED))
        dn = tl.where(y > 0, tl.dot(w_t, grad, input_precision="ieee"), 0.0)
        ok = channels < C
        scale = tl.load(coef_ptr + channels, mask=ok, other=0.0)
        shift = tl.load(coef_ptr + C + channels, mask=ok, other=0.0)
        slope = tl.load(coef_ptr + 2 * C + channels, mask=ok, other=0.0)
        dx = scale[:, None] * dn - shift[:, None] - normed * slope[:, None]
        offsets, mask = tile_offsets(b, channels, pixels, sdb, sdc, sdp, C, P)
        tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)


def blocks(channels: int, classes: int, compiled: bool, accumulating: bool = False) -> tuple[int, int, int]:
    """(pixels, channels, padded classes) per program: compiled, 64 × 32, and 32 × 32 for
    ``classifier_backward_kernel`` (``accumulating``), which spilled at 64 × 32 with 4 warps (ptxas, sm_90:
    at most 180 registers a thread, up to 128 classes, none spilled); under the interpreter (one program at
    a time, a fixed cost per operation) 64 pixels and up to 256 channels."""
    padded = max(16, triton.next_power_of_2(classes))
    if not compiled:
        return 64, max(16, min(256, triton.next_power_of_2(channels))), padded
    return 32 if accumulating else 64, 32, padded


def walking_programs(x: Tensor, pixel_blocks: int, others: int) -> int:
    """Programs per image and block of channels of the walking kernels: ``PROGRAMS_PER_SM`` per
    multiprocessor shared among the ``others`` (images × channel blocks), at most one per pixel block."""
    if not x.is_cuda:
        return min(pixel_blocks, INTERPRETER_PROGRAMS)
    programs = PROGRAMS_PER_SM * torch.cuda.get_device_properties(x.device).multi_processor_count
    return max(1, min(pixel_blocks, programs // others))


@custom_op("segattn::batch_stats", mutates_args=())
def batch_stats(x: Tensor) -> tuple[Tensor, Tensor]:
    """(mean, biased variance) of each channel of x [B, C, H, W] over images and pixels, fp32."""
    flat = x.flatten(2)
    batch, channels, pixels = flat.shape
    block_p, block_c, _ = blocks(channels, 1, x.is_cuda)
    pixel_blocks, channel_blocks = triton.cdiv(pixels, block_p), triton.cdiv(channels, block_c)
    programs = walking_programs(x, pixel_blocks, batch * channel_blocks)
    shift = flat[0, :, 0].float().contiguous()
    partials = torch.empty(batch, programs, 2, channels, dtype=torch.float32, device=x.device)
    stats_kernel[(channel_blocks, programs, batch)](
        flat, shift, partials, *flat.stride(), channels, pixels, pixel_blocks,
        BLOCK_P=block_p, BLOCK_C=block_c, num_warps=NUM_WARPS,
    )  # fmt: skip
    sums = partials.sum(dim=(0, 1)) / (batch * pixels)
    return shift + sums[0], (sums[1] - sums[0].square()).clamp_(min=0)


@register_fake("segattn::batch_stats")
def _(x):
    stats = x.new_empty(x.shape[1], dtype=torch.float32)
    return stats, stats.clone()


@custom_op("segattn::norm_relu_classifier", mutates_args=())
def norm_relu_classifier(
    x: Tensor,
    mean: Tensor,
    rstd: Tensor,
    gamma: Tensor,
    beta: Tensor,
    weight: Tensor,
    bias: Tensor,
    out_dtype: torch.dtype,
    output_read: bool = True,
) -> Tensor:
    """Logits [B, K, H, W] in ``out_dtype`` of the classifier ``weight`` [B, K, C] (one per image) + ``bias``
    on relu((x − mean)·rstd·γ + β); left unwritten without ``output_read`` (a recompute in backward, which
    keeps only what is saved)."""
    flat = x.flatten(2)
    batch, channels, pixels = flat.shape
    classes = weight.shape[1]
    out = torch.empty(batch, classes, *x.shape[2:], dtype=out_dtype, device=x.device)
    if not output_read:
        return out
    block_p, block_c, block_k = blocks(channels, classes, x.is_cuda)
    classifier_kernel[(triton.cdiv(pixels, block_p), batch)](
        flat, mean, rstd, gamma, beta, weight.contiguous(), bias, out, *flat.stride(), channels, classes,
        pixels, BLOCK_P=block_p, BLOCK_C=block_c, BLOCK_K=block_k, COMPILED=x.is_cuda, num_warps=NUM_WARPS,
    )  # fmt: skip
    return out


@register_fake("segattn::norm_relu_classifier")
def _(x, mean, rstd, gamma, beta, weight, bias, out_dtype, output_read=True):
    return torch.empty(x.shape[0], weight.shape[1], *x.shape[2:], dtype=out_dtype, device=x.device)


@custom_op("segattn::norm_relu_classifier_backward", mutates_args=())
def norm_relu_classifier_backward(
    grad: Tensor, x: Tensor, mean: Tensor, rstd: Tensor, gamma: Tensor, beta: Tensor, weight: Tensor
) -> tuple[Tensor, Tensor]:
    """(sums [2, C] fp32 of ∂n and ∂n·x̂ over images and pixels, ∂weight [B, K, C] in weight's dtype) of
    ``norm_relu_classifier`` from its logits' gradient; ∂n is the gradient of relu's input."""
    flat, grad = x.flatten(2), grad.contiguous()
    batch, channels, pixels = flat.shape
    classes = weight.shape[1]
    block_p, block_c, block_k = blocks(channels, classes, x.is_cuda, accumulating=True)
    pixel_blocks, channel_blocks = triton.cdiv(pixels, block_p), triton.cdiv(channels, block_c)
    programs = walking_programs(x, pixel_blocks, batch * channel_blocks)
    partials = torch.empty(batch, programs, 2, channels, dtype=torch.float32, device=x.device)
    weight_partials = torch.empty(batch, programs, classes, channels, dtype=torch.float32, device=x.device)
    classifier_backward_kernel[(channel_blocks, programs, batch)](
        grad, flat, mean, rstd, gamma, beta, weight.contiguous(), partials, weight_partials, *flat.stride(),
        channels, classes, pixels, pixel_blocks,
        BLOCK_P=block_p, BLOCK_C=block_c, BLOCK_K=block_k, COMPILED=x.is_cuda, num_warps=NUM_WARPS,
    )  # fmt: skip
    return partials.sum(dim=(0, 1)), weight_partials.sum(dim=1).to(weight.dtype)


@register_fake("segattn::norm_relu_classifier_backward")
def _(grad, x, mean, rstd, gamma, beta, weight):
    return x.new_empty(2, x.shape[1], dtype=torch.float32), weight.new_empty(weight.shape)


@custom_op("segattn::norm_relu_input_grad", mutates_args=())
def norm_relu_input_grad(
    grad: Tensor,
    x: Tensor,
    mean: Tensor,
    rstd: Tensor,
    gamma: Tensor,
    beta: Tensor,
    weight: Tensor,
    coefficients: Tensor,
) -> Tensor:
    """∂x = a·∂n − b − x̂·c (``coefficients`` [3, C] fp32: a, b, c per channel) in x's dtype and layout,
    ∂n recomputed from the logits' gradient as ``norm_relu_classifier_backward`` does."""
    flat, grad = x.flatten(2), grad.contiguous()
    grad_x = torch.empty_like(x)
    grad_flat = grad_x.flatten(2)
    batch, channels, pixels = flat.shape
    classes = weight.shape[1]
    block_p, block_c, block_k = blocks(channels, classes, x.is_cuda)
    input_grad_kernel[(triton.cdiv(pixels, block_p), batch)](
        grad, flat, mean, rstd, gamma, beta, weight.contiguous(), coefficients.contiguous(), grad_flat,
        *flat.stride(), *grad_flat.stride(), channels, classes, pixels,
        BLOCK_P=block_p, BLOCK_C=block_c, BLOCK_K=block_k, COMPILED=x.is_cuda, num_warps=NUM_WARPS,
    )  # fmt: skip
    return grad_x


@register_fake("segattn::norm_relu_input_grad")
def _(grad, x, mean, rstd, gamma, beta, weight, coefficients):
    return torch.empty_like(x)


def save_inputs(ctx, inputs: tuple, output: Tensor) -> None:
    x, mean, rstd, gamma, beta, weight, bias, *_ = inputs
    ctx.save_for_backward(x, mean, rstd, gamma, beta, weight)
    ctx.bias_dtype = bias.dtype


def backward(ctx, grad: Tensor) -> tuple:
    """BatchNorm's batch-statistics backward through ReLU and the classifier: mean and rstd, x's own, get
    none (their dependence on x is in x's gradient)."""
    x, mean, rstd, gamma, beta, weight = ctx.saved_tensors
    ops = torch.ops.segattn
    sums, grad_weight = ops.norm_relu_classifier_backward.default(grad, x, mean, rstd, gamma, beta, weight)
    scale = gamma.float() * rstd
    means = sums / (x.numel() // x.shape[1])
    coefficients = torch.stack((scale, scale * means[0], scale * means[1]))
    grad_x = ops.norm_relu_input_grad.default(grad, x, mean, rstd, gamma, beta, weight, coefficients)
    grad_bias = grad.sum((0, 2, 3), dtype=torch.float32).to(ctx.bias_dtype)
    sums = sums[1].to(gamma.dtype), sums[0].to(beta.dtype)
    return grad_x, None, None, *sums, grad_weight, grad_bias, None, None


register_autograd("segattn::norm_relu_classifier", backward, setup_context=save_inputs)


def batch_norm_relu_classifier(
    x: Tensor, norm: nn.BatchNorm2d, weight: Tensor, bias: Tensor, output_read: bool = True
) -> Tensor:
    """Logits of the classifier ``weight`` [B, K, C] (one per image) + ``bias`` on relu(norm(x)), ``norm`` in
    training mode with batch statistics, whose running statistics are updated as nn.BatchNorm2d's own
    training step updates them; in autocast's dtype where it is on, else x's. Unwritten without
    ``output_read``."""
    # a recompute in backward gets the forward's statistics, not another pass over x
    mean, var = reused(lambda: torch.ops.segattn.batch_stats.default(x.detach()))
    with torch.no_grad():
        norm.num_batches_tracked.add_(1)
        factor = 1.0 / float(norm.num_batches_tracked) if norm.momentum is None else norm.momentum
        count = x.numel() // x.shape[1]
        norm.running_mean.mul_(1 - factor).add_(mean.to(norm.running_mean.dtype), alpha=factor)
        unbiased = var * (count / (count - 1))
        norm.running_var.mul_(1 - factor).add_(unbiased.to(norm.running_var.dtype), alpha=factor)
    out_dtype = matmul_dtype(x)
    rstd = torch.rsqrt(var + norm.eps)
    return torch.ops.segattn.norm_relu_classifier.default(
        x, mean, rstd, norm.weight, norm.bias, weight, bias, out_dtype, output_read
    )
