"""Mix-FFN's 3×3 depthwise conv + bias + exact GELU as one Triton operator, ``segattn::depthwise_conv_gelu``,
on [B, N, C] tokens read in place as their row-major H×W grid (any strides; channels are the fast axis).

Forward (``conv_gelu_kernel``): grid (blocks of pixels × B, blocks of channels); each program sums the nine
zero-padded taps of its tile in fp32, adds the bias and writes GELU of it: one read and one write of the
hidden tensor; only the input is kept for backward, never the pre-activation.

Backward (``conv_gelu_backward_kernel``): grid (splits, blocks of channels); each program walks its share of
strips (rows × columns of one image) down their rows, keeping ĝ = ∂out·GELU'(pre) of three rows (above, at,
below) at each column's left, own and right neighbour in registers: each step recomputes the row below
(pre from the input's 3×3: reads that hit the cache) and gives ∂x(row) = Σ_taps w·ĝ without writing ĝ. One
read of the input and of the output gradient, one write of ∂x; the pre-activation is computed three times
per pixel (its column neighbours), plus two rows per strip. ∂w and ∂b are per-split fp32 partials of
Σ ĝ(p)·x(p + tap) and Σ ĝ(p), summed over the splits by the caller in a fixed order (deterministic).

TRITON_INTERPRET=1 (set before triton is first imported) runs the kernels on the CPU. This module imports
triton, so ``depthwise`` loads it on first use.
"""

# ruff: noqa: N803  (upper case: Triton's convention for compile-time constants)

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.library import custom_op, register_autograd, register_fake

INTERPRETER_SPLITS = 4  # the backward's programs per block of channels under the interpreter
SPLITS_PER_SM = 4
NUM_WARPS = 4
TAPS, TAP_ROWS = 9, 16  # the backward's partials: rows 0-8 ∂w per tap, row 9 ∂b, padded to a power of two
SQRT_HALF, INV_SQRT_2PI = tl.constexpr(0.7071067811865476), tl.constexpr(0.3989422804014327)


@triton.jit
def load_tile(base, rows, cols, channels, channels_ok, stride_n, stride_c, H, W):
    """[pixels, channels] of a [N, C] grid at (rows, cols) in fp32, zero outside the H×W grid."""
    inside = (rows >= 0) & (rows < H) & (cols >= 0) & (cols < W)
    offsets = (rows * W + cols).to(tl.int64)[:, None] * stride_n + channels[None, :] * stride_c
    return tl.load(base + offsets, mask=inside[:, None] & channels_ok[None, :], other=0.0).to(tl.float32)


@triton.jit
def pre_activation(x_base, w_ptr, b_ptr, rows, cols, channels, channels_ok, sxn, sxc, H, W):
    """conv(x)(rows, cols) + bias in fp32, [pixels, channels]; zero padding outside the H×W grid."""
    acc = tl.zeros([rows.shape[0], channels.shape[0]], dtype=tl.float32)
    for row in range(3):  # a loop, not unrolled: nine tiles of addresses in flight spill registers
        for col in tl.static_range(3):
            w = tl.load(w_ptr + channels * 9 + row * 3 + col, mask=channels_ok, other=0.0).to(tl.float32)
            x = load_tile(x_base, rows + row - 1, cols + col - 1, channels, channels_ok, sxn, sxc, H, W)
            acc += x * w[None, :]
    return acc + tl.load(b_ptr + channels, mask=channels_ok, other=0.0).to(tl.float32)[None, :]


@triton.jit
def gelu_input_grad(
    x_base, g_base, w_ptr, b_ptr, rows, cols, channels, channels_ok, sxn, sxc, sgn, sgc, H, W
):
    """∂out·GELU'(pre) at (rows, cols), fp32 [pixels, channels]; zero outside the grid."""
    pre = pre_activation(x_base, w_ptr, b_ptr, rows, cols, channels, channels_ok, sxn, sxc, H, W)
    g = load_tile(g_base, rows, cols, channels, channels_ok, sgn, sgc, H, W)
    cdf = 0.5 * (1.0 + tl.math.erf(pre * SQRT_HALF))
    return g * (cdf + pre * tl.exp(-0.5 * pre * pre) * INV_SQRT_2PI)


@triton.jit
def gelu_grad_row(x_base, g_base, w_ptr, b_ptr, rows, cols, channels, ok, sxn, sxc, sgn, sgc, H, W):
    """``gelu_input_grad`` at (rows, cols − 1), (rows, cols) and (rows, cols + 1)."""
    left = gelu_input_grad(
        x_base, g_base, w_ptr, b_ptr, rows, cols - 1, channels, ok, sxn, sxc, sgn, sgc, H, W
    )
    centre = gelu_input_grad(x_base, g_base, w_ptr, b_ptr, rows, cols, channels, ok, sxn, sxc, sgn, sgc, H, W)
    right = gelu_input_grad(
        x_base, g_base, w_ptr, b_ptr, rows, cols + 1, channels, ok, sxn, sxc, sgn, sgc, H, W
    )
    return left, centre, right


@triton.jit
def conv_gelu_kernel(
    x_ptr, w_ptr, b_ptr, out_ptr, sxb, sxn, sxc, C, H, W, pixel_blocks,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    block = tl.program_id(0)
    batch = (block // pixel_blocks).to(tl.int64)
    pixels = (block % pixel_blocks) * BLOCK_P + tl.arange(0, BLOCK_P)
    channels = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    ok = channels < C
    rows, cols = pixels // W, pixels % W  # past the last pixel: rows ≥ H, masked as outside
    pre = pre_activation(x_ptr + batch * sxb, w_ptr, b_ptr, rows, cols, channels, ok, sxn, sxc, H, W)
    out = 0.5 * pre * (1.0 + tl.math.erf(pre * SQRT_HALF))
    offsets = batch * H * W * C + pixels.to(tl.int64)[:, None] * C + channels[None, :]
    tl.store(out_ptr + offsets, out, mask=(rows < H)[:, None] & ok[None, :])


@triton.jit
def weighted_row(w_ptr, channels, ok, i, left, centre, right):
    """Σ_j W[i, j]·ĝ(·, w + 1 − j) for one kernel row i, from ĝ at w − 1, w and w + 1."""
    w_left = tl.load(w_ptr + channels * 9 + i * 3 + 2, mask=ok, other=0.0).to(tl.float32)
    w_centre = tl.load(w_ptr + channels * 9 + i * 3 + 1, mask=ok, other=0.0).to(tl.float32)
    w_right = tl.load(w_ptr + channels * 9 + i * 3, mask=ok, other=0.0).to(tl.float32)
    return left * w_left[None, :] + centre * w_centre[None, :] + right * w_right[None, :]


@triton.jit
def conv_gelu_backward_kernel(
    x_ptr, g_ptr, w_ptr, b_ptr, dx_ptr, part_ptr, sxb, sxn, sxc, sgb, sgn, sgc, C, H, W, row_groups,
    col_blocks, num_strips, ROWS: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    split, splits = tl.program_id(0), tl.num_programs(0)
    channels = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    ok = channels < C
    taps = tl.arange(0, 16)
    partials = tl.zeros([16, BLOCK_C], dtype=tl.float32)  # Σ ĝ·x per tap (rows 0-8), Σ ĝ (row 9)
    for strip in range(split, num_strips, splits):  # ROWS rows × BLOCK_W columns of one image
        batch = (strip // (row_groups * col_blocks)).to(tl.int64)
        first = (strip // col_blocks % row_groups) * ROWS
        cols = (strip % col_blocks) * BLOCK_W + tl.arange(0, BLOCK_W)
        x_base, g_base = x_ptr + batch * sxb, g_ptr + batch * sgb
        row_of = tl.zeros([BLOCK_W], dtype=tl.int32)  # + a row: that row for every column
        # ĝ of the row above the strip and of its first row, then rolled down a row per step
        above = row_of + first - 1
        up_l, up_c, up_r = gelu_grad_row(
            x_base, g_base, w_ptr, b_ptr, above, cols, channels, ok, sxn, sxc, sgn, sgc, H, W
        )
        at_l, at_c, at_r = gelu_grad_row(
            x_base, g_base, w_ptr, b_ptr, above + 1, cols, channels, ok, sxn, sxc, sgn, sgc, H, W
        )
        for row in range(first, tl.minimum(first + ROWS, H)):
            below = row_of + row + 1
            down_l, down_c, down_r = gelu_grad_row(
                x_base, g_base, w_ptr, b_ptr, below, cols, channels, ok, sxn, sxc, sgn, sgc, H, W
            )
            # ∂x(row, w) = Σ_ij W[i, j]·ĝ(row + 1 − i, w + 1 − j)
            grad = weighted_row(w_ptr, channels, ok, 0, down_l, down_c, down_r)
            grad += weighted_row(w_ptr, channels, ok, 1, at_l, at_c, at_r)
            grad += weighted_row(w_ptr, channels, ok, 2, up_l, up_c, up_r)
            pixels = (row * W + cols).to(tl.int64)
            offsets = batch * H * W * C + pixels[:, None] * C + channels[None, :]
            tl.store(dx_ptr + offsets, grad, mask=(cols < W)[:, None] & ok[None, :])
            # ∂w[i, j] += Σ_w ĝ(row, w)·x(row + i − 1, w + j − 1); ∂b += Σ_w ĝ(row, w)
            partials += tl.where(taps[:, None] == 9, tl.sum(at_c, axis=0)[None, :], 0.0)
            for tap in range(9):
                r, c = row_of + row + (tap // 3 - 1), cols + (tap % 3 - 1)
                x = load_tile(x_base, r, c, channels, ok, sxn, sxc, H, W)
                partials += tl.where(taps[:, None] == tap, tl.sum(at_c * x, axis=0)[None, :], 0.0)
            up_l, up_c, up_r = at_l, at_c, at_r
            at_l, at_c, at_r = down_l, down_c, down_r
    part_offsets = split * 16 * C + taps[:, None] * C + channels[None, :]
    tl.store(part_ptr + part_offsets, partials, mask=(taps < 10)[:, None] & ok[None, :])


def blocks(channels: int, compiled: bool) -> tuple[int, int]:
    """(pixels, channels) per forward program: 16 × 64 (128 bytes of bf16 a row) where C allows; under the
    interpreter (not ``compiled``), which runs programs one by one at a fixed cost per operation, 64 pixels
    and up to 256 channels."""
    widest = 64 if compiled else 256
    return 16 if compiled else 64, max(16, min(widest, triton.next_power_of_2(channels)))


def strips(height: int, width: int, compiled: bool) -> tuple[int, int]:
    """(rows, columns) of the backward's strips: 16 × 8 (the two rows of ĝ computed before each strip's
    first cost 1/8 more; at 64 channels and 4 warps 145 registers on sm_90, where 16 columns took 216);
    under the interpreter, which pays per operation, two strips down the rows and one across the columns,
    except that grids up to 8 wide take 4 columns, so the tests' tiny grids still cross strips both ways."""
    if compiled:
        return 16, 8
    return max(4, triton.cdiv(height, 2)), 4 if width <= 8 else triton.next_power_of_2(width)


def backward_splits(x: Tensor, num_strips: int, channel_blocks: int) -> int:
    """Programs per block of channels in backward: a few per multiprocessor in all."""
    if not x.is_cuda:
        return min(num_strips, INTERPRETER_SPLITS)
    programs = SPLITS_PER_SM * torch.cuda.get_device_properties(x.device).multi_processor_count
    return max(1, min(num_strips, programs // channel_blocks))


@custom_op("segattn::depthwise_conv_gelu", mutates_args=())
def depthwise_conv_gelu(x: Tensor, weight: Tensor, bias: Tensor, height: int, width: int) -> Tensor:
    """GELU(depthwise 3×3 conv(x) + bias) of [B, N, C] tokens on their height × width grid (N = H·W, row
    major), ``weight`` [C, 1, 3, 3], ``bias`` [C]: contiguous [B, N, C] in x's dtype, fp32 inside."""
    batch, _, channels = x.shape
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    block_p, block_c = blocks(channels, x.is_cuda)
    pixel_blocks = triton.cdiv(height * width, block_p)
    grid = (batch * pixel_blocks, triton.cdiv(channels, block_c))
    conv_gelu_kernel[grid](
        x, weight.contiguous(), bias.contiguous(), out, *x.stride(), channels, height, width, pixel_blocks,
        BLOCK_P=block_p, BLOCK_C=block_c, num_warps=NUM_WARPS,
    )  # fmt: skip
    return out


@register_fake("segattn::depthwise_conv_gelu")
def _(x, weight, bias, height, width):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@custom_op("segattn::depthwise_conv_gelu_backward", mutates_args=())
def depthwise_conv_gelu_backward(
    grad: Tensor, x: Tensor, weight: Tensor, bias: Tensor, height: int, width: int
) -> tuple[Tensor, Tensor, Tensor]:
    """(∂x, ∂weight, ∂bias) of ``depthwise_conv_gelu`` from the output gradient; the pre-activation is
    recomputed."""
    batch, _, channels = x.shape
    grad_x = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    block_c = blocks(channels, x.is_cuda)[1]
    rows, columns = strips(height, width, x.is_cuda)
    row_groups, col_blocks = triton.cdiv(height, rows), triton.cdiv(width, columns)
    num_strips = batch * row_groups * col_blocks
    channel_blocks = triton.cdiv(channels, block_c)
    splits = backward_splits(x, num_strips, channel_blocks)
    partials = torch.empty(splits, TAP_ROWS, channels, dtype=torch.float32, device=x.device)
    conv_gelu_backward_kernel[(splits, channel_blocks)](
        x, grad, weight.contiguous(), bias.contiguous(), grad_x, partials, *x.stride(), *grad.stride(),
        channels, height, width, row_groups, col_blocks, num_strips, ROWS=rows, BLOCK_W=columns,
        BLOCK_C=block_c, num_warps=NUM_WARPS,
    )  # fmt: skip
    sums = partials[:, : TAPS + 1].sum(dim=0)  # copies: an operator's results may not share storage
    grad_weight = sums[:TAPS].t().reshape(weight.shape).to(weight.dtype)
    return (
        grad_x,
        grad_weight.clone(memory_format=torch.contiguous_format),
        sums[TAPS].to(bias.dtype, copy=True),
    )


@register_fake("segattn::depthwise_conv_gelu_backward")
def _(grad, x, weight, bias, height, width):
    grad_x = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return grad_x, weight.new_empty(weight.shape), bias.new_empty(bias.shape)


def save_inputs(ctx, inputs: tuple, output: Tensor) -> None:
    x, weight, bias, height, width = inputs
    ctx.save_for_backward(x, weight, bias)
    ctx.hw = height, width


def backward(ctx, grad: Tensor) -> tuple:
    x, weight, bias = ctx.saved_tensors
    return *torch.ops.segattn.depthwise_conv_gelu_backward.default(grad, x, weight, bias, *ctx.hw), None, None


register_autograd("segattn::depthwise_conv_gelu", backward, setup_context=save_inputs)
