"""LayerNorm over the last axis as one Triton operator, ``segattn::layer_norm``, for the narrow rows of
high-resolution token maps (PVT's first stage normalises a million rows of 32 channels).

Forward (``layer_norm_kernel``): grid (blocks of ``BLOCK_ROWS`` rows); each program normalises its rows in
fp32 and writes y in ``out_dtype`` (under autocast the dtype the next matmul would cast it to, so the fp32
copy and the cast are never written), with each row's mean and 1/std (fp32) kept for backward.

Backward (``layer_norm_backward_kernel``): grid (a few programs per multiprocessor); each walks its share
of the row blocks, writes ∂x = (w·∂y − mean(w·∂y) − x̂·mean(w·∂y·x̂))/std in x's dtype, and adds ∂y·x̂ and ∂y
into fp32 accumulators of its tile's shape, reduced over rows once at its end; the caller sums the
programs' partials in a fixed order (deterministic, no atomics).

``segattn::residual_layer_norm`` is the same two kernels with a block's residual add before the norm
(``RESIDUAL``): the forward writes s = x + branch·scale (stochastic depth's factor per image) and normalises
it; the backward adds the gradient s gets from the rest of the block to the norm's ∂s and writes the sum
once in x's dtype and once, times the factor, in the branch's: neither the add nor its gradient's sum, cast
and factor is a pass of its own.

TRITON_INTERPRET=1 (set before triton is first imported) runs the kernels on the CPU. This module imports
triton, so ``norm`` loads it on first use.
"""

# ruff: noqa: N803  (upper case: Triton's convention for compile-time constants)

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.library import custom_op, register_autograd, register_fake

TILE = 2048  # elements of a program's tile: BLOCK_ROWS × the channels padded to a power of two
PROGRAMS_PER_SM = 4  # backward programs per multiprocessor
# the residual backward's warps (Triton's default: 4): for 32 channels and a bf16 branch on sm_90 ptxas gives
# it 255 registers a thread at 4, 121 at 8, so twice the warps fit (tests/attention/test_triton_compile.py)
RESIDUAL_BACKWARD_WARPS = 8
INTERPRETER_PROGRAMS = 2


@triton.jit
def load_rows(ptr, rows, channels, M, C):
    """[BLOCK_ROWS, BLOCK_C] of a contiguous [M, C] tensor in fp32, 0 outside it."""
    mask = (rows < M)[:, None] & (channels < C)[None, :]
    offsets = rows.to(tl.int64)[:, None] * C + channels[None, :]
    return tl.load(ptr + offsets, mask=mask, other=0.0).to(tl.float32), offsets, mask


@triton.jit
def layer_norm_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, M, C, eps,
    branch_ptr, scale_ptr, sum_ptr, N,
    BLOCK_ROWS: tl.constexpr, BLOCK_C: tl.constexpr, RESIDUAL: tl.constexpr, SCALED: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    channels = tl.arange(0, BLOCK_C)
    x, offsets, mask = load_rows(x_ptr, rows, channels, M, C)
    if RESIDUAL:  # x + branch·scale (rows of N tokens an image), normalised as written
        branch = tl.load(branch_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        if SCALED:
            branch *= tl.load(scale_ptr + rows // N, mask=rows < M, other=0.0)[:, None]
        x = (x + branch).to(sum_ptr.dtype.element_ty)
        tl.store(sum_ptr + offsets, x, mask=mask)
        x = x.to(tl.float32)
    mean = tl.sum(x, axis=1) / C
    centred = tl.where(mask, x - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=1) / C + eps)
    w = tl.load(w_ptr + channels, mask=channels < C, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + channels, mask=channels < C, other=0.0).to(tl.float32)
    y = centred * rstd[:, None] * w[None, :] + b[None, :]
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + rows, mean, mask=rows < M)
    tl.store(rstd_ptr + rows, rstd, mask=rows < M)


@triton.jit
def layer_norm_backward_kernel(
    grad_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, part_ptr, M, C, row_blocks,
    grad_sum_ptr, scale_ptr, dbranch_ptr, N,
    BLOCK_ROWS: tl.constexpr, BLOCK_C: tl.constexpr, RESIDUAL: tl.constexpr, SCALED: tl.constexpr,
    GRAD_SUM: tl.constexpr,
):  # fmt: skip
    program, programs = tl.program_id(0), tl.num_programs(0)
    channels = tl.arange(0, BLOCK_C)
    w = tl.load(w_ptr + channels, mask=channels < C, other=0.0).to(tl.float32)
    grad_w = tl.zeros([BLOCK_ROWS, BLOCK_C], dtype=tl.float32)
    grad_b = tl.zeros([BLOCK_ROWS, BLOCK_C], dtype=tl.float32)
    for block in range(program, row_blocks, programs):
        rows = block * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        x, offsets, mask = load_rows(x_ptr, rows, channels, M, C)
        dy = tl.load(grad_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(mean_ptr + rows, mask=rows < M, other=0.0)
        rstd = tl.load(rstd_ptr + rows, mask=rows < M, other=0.0)
        normed = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        wdy = dy * w[None, :]
        mean_wdy = tl.sum(wdy, axis=1) / C
        mean_wdy_normed = tl.sum(wdy * normed, axis=1) / C
        dx = (wdy - mean_wdy[:, None] - normed * mean_wdy_normed[:, None]) * rstd[:, None]
        if GRAD_SUM:
            dx += tl.load(grad_sum_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        if RESIDUAL:
            if SCALED:
                dx *= tl.load(scale_ptr + rows // N, mask=rows < M, other=0.0)[:, None]
            tl.store(dbranch_ptr + offsets, dx.to(dbranch_ptr.dtype.element_ty), mask=mask)
        grad_w += dy * normed
        grad_b += dy
    part = part_ptr + program * 2 * C + channels
    tl.store(part, tl.sum(grad_w, axis=0), mask=channels < C)
    tl.store(part + C, tl.sum(grad_b, axis=0), mask=channels < C)


def tile(channels: int) -> tuple[int, int]:
    """(rows, padded channels) of a program's tile: ``TILE`` elements (at least one row)."""
    padded = triton.next_power_of_2(channels)
    return max(1, TILE // padded), padded


def launch_forward(
    x: Tensor,
    weight: Tensor,
    bias: Tensor,
    eps: float,
    out_dtype: torch.dtype,
    branch: Tensor | None = None,
    scale: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(s, y, mean, 1/std) of ``layer_norm_kernel``: s = x + branch·scale (x itself without a branch)."""
    channels = x.shape[-1]
    rows = x.numel() // channels
    x = x.contiguous()
    summed = x if branch is None else torch.empty_like(x)
    y = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    mean = torch.empty(rows, dtype=torch.float32, device=x.device)
    rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
    block_rows, block_c = tile(channels)
    layer_norm_kernel[(triton.cdiv(rows, block_rows),)](
        x, weight.contiguous(), bias.contiguous(), y, mean, rstd, rows, channels, eps,
        x if branch is None else branch.contiguous(), x if scale is None else scale, summed,
        rows // (1 if scale is None else scale.numel()),
        BLOCK_ROWS=block_rows, BLOCK_C=block_c, RESIDUAL=branch is not None, SCALED=scale is not None,
    )  # fmt: skip
    return summed, y, mean, rstd


@custom_op("segattn::layer_norm", mutates_args=())
def layer_norm(
    x: Tensor, weight: Tensor, bias: Tensor, eps: float, out_dtype: torch.dtype
) -> tuple[Tensor, Tensor, Tensor]:
    """(y, mean, 1/std) of LayerNorm over x's last axis (at most ``norm.MAX_CHANNELS`` wide): y in
    ``out_dtype``, the statistics fp32 per row; fp32 inside."""
    return launch_forward(x, weight, bias, eps, out_dtype)[1:]


@register_fake("segattn::layer_norm")
def layer_norm_fake(x, weight, bias, eps, out_dtype):
    rows = x.numel() // x.shape[-1]
    stats = x.new_empty(rows, dtype=torch.float32)
    return torch.empty(x.shape, dtype=out_dtype, device=x.device), stats, stats.clone()


@custom_op("segattn::residual_layer_norm", mutates_args=())
def residual_layer_norm(
    x: Tensor,
    branch: Tensor,
    scale: Tensor | None,
    weight: Tensor,
    bias: Tensor,
    eps: float,
    out_dtype: torch.dtype,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(s, y, mean, 1/std): a residual add s = x + branch·scale[image] in x's dtype (``scale``: fp32, one
    stochastic-depth factor an image, x's first axis; None: 1) and ``layer_norm`` of s, in one launch."""
    return launch_forward(x, weight, bias, eps, out_dtype, branch, scale)


@register_fake("segattn::residual_layer_norm")
def _(x, branch, scale, weight, bias, eps, out_dtype):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device), *layer_norm_fake(
        x, weight, bias, eps, out_dtype
    )


def backward_programs(x: Tensor, row_blocks: int) -> int:
    """Backward programs: a few per multiprocessor, never more than the row blocks."""
    if not x.is_cuda:
        return min(row_blocks, INTERPRETER_PROGRAMS)
    return max(
        1, min(row_blocks, PROGRAMS_PER_SM * torch.cuda.get_device_properties(x.device).multi_processor_count)
    )


def launch_backward(
    grad: Tensor,
    x: Tensor,
    weight: Tensor,
    mean: Tensor,
    rstd: Tensor,
    grad_sum: Tensor | None = None,
    scale: Tensor | None = None,
    branch_dtype: torch.dtype | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(∂x + grad_sum, that times scale in ``branch_dtype`` (∂x again without it), ∂weight, ∂bias) of
    ``layer_norm_backward_kernel``."""
    channels = x.shape[-1]
    rows = x.numel() // channels
    x, grad = x.contiguous(), grad.contiguous()
    grad_x = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    grad_branch = grad_x if branch_dtype is None else torch.empty_like(x, dtype=branch_dtype)
    block_rows, block_c = tile(channels)
    row_blocks = triton.cdiv(rows, block_rows)
    programs = backward_programs(x, row_blocks)
    partials = torch.empty(programs, 2, channels, dtype=torch.float32, device=x.device)
    layer_norm_backward_kernel[(programs,)](
        grad, x, weight.contiguous(), mean, rstd, grad_x, partials, rows, channels, row_blocks,
        x if grad_sum is None else grad_sum.contiguous(), x if scale is None else scale, grad_branch,
        rows // (1 if scale is None else scale.numel()),
        BLOCK_ROWS=block_rows, BLOCK_C=block_c, RESIDUAL=branch_dtype is not None, SCALED=scale is not None,
        GRAD_SUM=grad_sum is not None, num_warps=4 if branch_dtype is None else RESIDUAL_BACKWARD_WARPS,
    )  # fmt: skip
    sums = partials.sum(dim=0)
    return (
        grad_x,
        grad_branch,
        sums[0].to(weight.dtype, copy=True),
        sums[1].to(weight.dtype, copy=True),
    )  # no shared storage


@custom_op("segattn::layer_norm_backward", mutates_args=())
def layer_norm_backward(
    grad: Tensor, x: Tensor, weight: Tensor, mean: Tensor, rstd: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """(∂x, ∂weight, ∂bias) of ``layer_norm`` from y's gradient and the kept statistics."""
    grad_x, _, *grad_parameters = launch_backward(grad, x, weight, mean, rstd)
    return grad_x, *grad_parameters


@register_fake("segattn::layer_norm_backward")
def layer_norm_backward_fake(grad, x, weight, mean, rstd):
    return (
        torch.empty(x.shape, dtype=x.dtype, device=x.device),
        weight.new_empty(weight.shape),
        weight.new_empty(weight.shape),
    )


@custom_op("segattn::residual_layer_norm_backward", mutates_args=())
def residual_layer_norm_backward(
    grad_sum: Tensor | None,
    grad: Tensor,
    summed: Tensor,
    scale: Tensor | None,
    weight: Tensor,
    mean: Tensor,
    rstd: Tensor,
    branch_dtype: torch.dtype,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(∂x, ∂branch, ∂weight, ∂bias) of ``residual_layer_norm`` from s's gradient (None: s unused) and y's:
    ∂x = ∂s + ``layer_norm_backward``'s ∂s, ∂branch = ∂x·scale[image] in ``branch_dtype``."""
    return launch_backward(grad, summed, weight, mean, rstd, grad_sum, scale, branch_dtype)


@register_fake("segattn::residual_layer_norm_backward")
def _(grad_sum, grad, summed, scale, weight, mean, rstd, branch_dtype):
    grad_x, grad_weight, grad_bias = layer_norm_backward_fake(grad, summed, weight, mean, rstd)
    return grad_x, torch.empty(summed.shape, dtype=branch_dtype, device=summed.device), grad_weight, grad_bias


def save_inputs(ctx, inputs: tuple, output: tuple) -> None:
    x, weight, _, _, _ = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, weight, mean, rstd)
    ctx.set_materialize_grads(False)  # the statistics' gradients are never used: no zeros for them


def backward(ctx, grad: Tensor, _grad_mean: Tensor | None, _grad_rstd: Tensor | None) -> tuple:
    x, weight, mean, rstd = ctx.saved_tensors
    grads = torch.ops.segattn.layer_norm_backward.default(grad, x, weight, mean, rstd)
    return *grads, None, None


def save_residual_inputs(ctx, inputs: tuple, output: tuple) -> None:
    _, branch, scale, weight, _, _, _ = inputs
    summed, _, mean, rstd = output
    ctx.save_for_backward(summed, scale, weight, mean, rstd)
    ctx.branch_dtype = branch.dtype
    ctx.set_materialize_grads(False)  # no zeros for the statistics, nor for s where only y is used


def residual_backward(ctx, grad_sum: Tensor | None, grad: Tensor, *_grad_stats: Tensor | None) -> tuple:
    summed, scale, weight, mean, rstd = ctx.saved_tensors
    grad_x, grad_branch, grad_weight, grad_bias = torch.ops.segattn.residual_layer_norm_backward.default(
        grad_sum, grad, summed, scale, weight, mean, rstd, ctx.branch_dtype
    )
    return grad_x, grad_branch, None, grad_weight, grad_bias, None, None


register_autograd("segattn::layer_norm", backward, setup_context=save_inputs)
register_autograd("segattn::residual_layer_norm", residual_backward, setup_context=save_residual_inputs)
