"""Mix-FFN's fc1 bias + 3×3 depthwise conv + bias + exact GELU as one Triton operator,
``segattn::depthwise_conv_gelu``, on [B, N, C] tokens read in place as their row-major H×W grid (any
strides; channels are the fast axis). fc1 runs without its bias, which the operator adds to each tap it
loads inside the grid (the conv's zero padding stays zero), so no pass over the hidden tensor sums its
gradient (``input_bias_grad``).

Forward (``conv_gelu_kernel``): grid (blocks of pixels × B, blocks of channels); each program sums the nine
zero-padded taps of its tile in fp32, adds the bias and writes GELU of it: one read and one write of the
hidden tensor; only the input is kept for backward, never the pre-activation.

Backward: two operators, one launch each, shaped like the forward (independent loads of one tile each):

- ``depthwise_gelu_backward`` (``gelu_backward_kernel``): recomputes each tile's pre-activation as the
  forward does and writes ĝ = ∂out·GELU'(pre) in x's dtype (rounded, as PyTorch's own GELU backward keeps
  it under autocast). A fixed number of programs per block of channels (``backward_programs``) walk the
  pixel blocks with a stride, adding ĝ(p)·x(p + tap) per tap and ĝ elementwise to ten fp32 register tiles,
  reduced over pixels once at the end: ∂w and ∂b partials [programs, 10, C] (from the unrounded ĝ), summed
  by the caller in a fixed order (deterministic, no atomics). The input bias's gradient follows from ∂b
  and ĝ's border rows and columns.
- ``depthwise_conv_input_grad``: ∂x, the transposed conv of ĝ: ``conv_gelu_kernel`` without GELU on the
  flipped weights.

5 passes over the hidden tensor (read x and ∂out, write ĝ; read ĝ, write ∂x): 2 more than the fused
backward they replace, which kept ĝ in registers while walking strips of rows and took 8.0 ms a call on an
H200 (pvt-b0 at 4096², bf16) against the forward's 0.48 ms.

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

INTERPRETER_PROGRAMS = 2  # gelu_backward_kernel's programs per block of channels under the interpreter
# gelu_backward_kernel's programs per multiprocessor: all resident at once on aligned contiguous tensors,
# where ptxas gives it 80 registers a thread in bf16 and 102 in fp32 (6 and 4 programs of 4 warps fit)
PROGRAMS_PER_SM = 4
NUM_WARPS = 4
SQRT_HALF, INV_SQRT_2PI = tl.constexpr(0.7071067811865476), tl.constexpr(0.3989422804014327)


@triton.jit
def load_tile(base, rows, cols, channels, channels_ok, stride_n, stride_c, H, W, shift, SHIFT: tl.constexpr):
    """[pixels, channels] of a [N, C] grid at (rows, cols) in fp32, plus ``shift`` [channels] where
    ``SHIFT``; zero outside the H×W grid."""
    inside = (rows >= 0) & (rows < H) & (cols >= 0) & (cols < W)
    offsets = (rows * W + cols).to(tl.int64)[:, None] * stride_n + channels[None, :] * stride_c
    tile = tl.load(base + offsets, mask=inside[:, None] & channels_ok[None, :], other=0.0).to(tl.float32)
    if SHIFT:
        tile += tl.where(inside[:, None], shift[None, :], 0.0)
    return tile


@triton.jit
def conv_tile(x_base, w_ptr, rows, cols, channels, channels_ok, sxn, sxc, H, W, shift, SHIFT: tl.constexpr):
    """The depthwise 3×3 conv of x (+ ``shift``) at (rows, cols) in fp32, [pixels, channels]; zero padding
    outside the H×W grid."""
    acc = tl.zeros([rows.shape[0], channels.shape[0]], dtype=tl.float32)
    for row in range(3):  # a loop, not unrolled: nine tiles of addresses in flight spill registers
        for col in tl.static_range(3):
            w = tl.load(w_ptr + channels * 9 + row * 3 + col, mask=channels_ok, other=0.0).to(tl.float32)
            rows_at, cols_at = rows + row - 1, cols + col - 1
            x = load_tile(x_base, rows_at, cols_at, channels, channels_ok, sxn, sxc, H, W, shift, SHIFT)
            acc += x * w[None, :]
    return acc


@triton.jit
def conv_gelu_kernel(
    x_ptr, xb_ptr, w_ptr, b_ptr, out_ptr, sxb, sxn, sxc, C, H, W, pixel_blocks,
    GELU: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """GELU(conv(x + xb) + b) per tile into contiguous [B, N, C]; without ``GELU``, conv(x) alone (xb and b
    unread)."""
    block = tl.program_id(0)
    batch = (block // pixel_blocks).to(tl.int64)
    pixels = (block % pixel_blocks) * BLOCK_P + tl.arange(0, BLOCK_P)
    channels = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    ok = channels < C
    rows, cols = pixels // W, pixels % W  # past the last pixel: rows ≥ H, masked as outside
    shift = tl.zeros([BLOCK_C], dtype=tl.float32)
    if GELU:
        shift = tl.load(xb_ptr + channels, mask=ok, other=0.0).to(tl.float32)
    out = conv_tile(x_ptr + batch * sxb, w_ptr, rows, cols, channels, ok, sxn, sxc, H, W, shift, GELU)
    if GELU:
        pre = out + tl.load(b_ptr + channels, mask=ok, other=0.0).to(tl.float32)[None, :]
        out = 0.5 * pre * (1.0 + tl.math.erf(pre * SQRT_HALF))
    offsets = batch * H * W * C + pixels.to(tl.int64)[:, None] * C + channels[None, :]
    tl.store(out_ptr + offsets, out, mask=(rows < H)[:, None] & ok[None, :])


@triton.jit
def gelu_backward_kernel(
    x_ptr, xb_ptr, g_ptr, w_ptr, b_ptr, dpre_ptr, part_ptr, sxb, sxn, sxc, sgb, sgn, sgc, C, H, W,
    pixel_blocks, num_blocks, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """ĝ = ∂out·GELU'(conv(x + xb) + b) per tile into contiguous [B, N, C], and this program's partials of
    ∂w (Σ ĝ(p)·(x + xb)(p + tap), rows 0-8) and ∂b (Σ ĝ, row 9) over the pixel blocks it walks."""
    program, programs = tl.program_id(0), tl.num_programs(0)
    channels = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    ok = channels < C
    bias = tl.load(b_ptr + channels, mask=ok, other=0.0).to(tl.float32)[None, :]
    shift = tl.load(xb_ptr + channels, mask=ok, other=0.0).to(tl.float32)
    zeros = tl.zeros([BLOCK_P, BLOCK_C], dtype=tl.float32)
    taps, bias_grad = (zeros,) * 9, zeros  # per thread, each pixel's own: reduced once, at the end
    for block in range(program, num_blocks, programs):
        batch = (block // pixel_blocks).to(tl.int64)
        pixels = (block % pixel_blocks) * BLOCK_P + tl.arange(0, BLOCK_P)
        rows, cols = pixels // W, pixels % W
        x_base = x_ptr + batch * sxb
        pre = conv_tile(x_base, w_ptr, rows, cols, channels, ok, sxn, sxc, H, W, shift, True) + bias
        g = load_tile(g_ptr + batch * sgb, rows, cols, channels, ok, sgn, sgc, H, W, shift, False)
        cdf = 0.5 * (1.0 + tl.math.erf(pre * SQRT_HALF))
        grad = g * (cdf + pre * tl.exp(-0.5 * pre * pre) * INV_SQRT_2PI)
        offsets = batch * H * W * C + pixels.to(tl.int64)[:, None] * C + channels[None, :]
        tl.store(dpre_ptr + offsets, grad, mask=(rows < H)[:, None] & ok[None, :])
        bias_grad += grad
        taps = [  # rebuilt whole: Triton compiles a comprehension over a literal tuple, not a static_range
            taps[t]
            + grad
            * load_tile(
                x_base, rows + t // 3 - 1, cols + t % 3 - 1, channels, ok, sxn, sxc, H, W, shift, True
            )
            for t in (0, 1, 2, 3, 4, 5, 6, 7, 8)
        ]
    part = part_ptr + program * 10 * C + channels
    for t in tl.static_range(9):
        tl.store(part + t * C, tl.sum(taps[t], axis=0), mask=ok)
    tl.store(part + 9 * C, tl.sum(bias_grad, axis=0), mask=ok)


def blocks(channels: int, compiled: bool, accumulating: bool = False) -> tuple[int, int]:
    """(pixels, channels) per program: 16 × 64 (128 bytes of bf16 a row) where C allows, 8 × 64 for
    ``gelu_backward_kernel`` (``accumulating``), whose ten accumulators spill at 16 pixels; under the
    interpreter (not ``compiled``), which runs programs one by one at a fixed cost per operation, 64 pixels
    and up to 256 channels."""
    widest = 64 if compiled else 256
    pixels = (8 if accumulating else 16) if compiled else 64
    return pixels, max(16, min(widest, triton.next_power_of_2(channels)))


def backward_programs(x: Tensor, num_blocks: int, channel_blocks: int) -> int:
    """``gelu_backward_kernel``'s programs per block of channels: as many as fit on the multiprocessors at
    once (``PROGRAMS_PER_SM``), at most one per block of pixels."""
    if not x.is_cuda:
        return min(num_blocks, INTERPRETER_PROGRAMS)
    programs = PROGRAMS_PER_SM * torch.cuda.get_device_properties(x.device).multi_processor_count
    return max(1, min(num_blocks, programs // channel_blocks))


def conv(x: Tensor, weight: Tensor, height: int, width: int, biases: tuple[Tensor, Tensor] | None) -> Tensor:
    """``conv_gelu_kernel`` over x: GELU(conv(x + input bias) + bias) given ``biases`` (input bias, bias),
    else conv(x) alone; contiguous [B, N, C] in x's dtype."""
    batch, _, channels = x.shape
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    block_p, block_c = blocks(channels, x.is_cuda)
    pixel_blocks = triton.cdiv(height * width, block_p)
    grid = (batch * pixel_blocks, triton.cdiv(channels, block_c))
    input_bias, bias = (weight, weight) if biases is None else (b.contiguous() for b in biases)  # unread
    conv_gelu_kernel[grid](
        x, input_bias, weight.contiguous(), bias, out, *x.stride(), channels, height, width, pixel_blocks,
        GELU=biases is not None, BLOCK_P=block_p, BLOCK_C=block_c, num_warps=NUM_WARPS,
    )  # fmt: skip
    return out


@custom_op("segattn::depthwise_conv_gelu", mutates_args=())
def depthwise_conv_gelu(
    x: Tensor, input_bias: Tensor, weight: Tensor, bias: Tensor, height: int, width: int
) -> Tensor:
    """GELU(depthwise 3×3 conv(x + input_bias) + bias) of [B, N, C] tokens on their height × width grid
    (N = H·W, row major; the conv pads x + input_bias with zeros), ``input_bias`` and ``bias`` [C],
    ``weight`` [C, 1, 3, 3]: contiguous [B, N, C] in x's dtype, fp32 inside."""
    return conv(x, weight, height, width, (input_bias, bias))


@register_fake("segattn::depthwise_conv_gelu")
def _(x, input_bias, weight, bias, height, width):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def input_bias_grad(grad_pre: Tensor, bias_grad: Tensor, weight: Tensor, height: int, width: int) -> Tensor:
    """∂(input bias) = Σ_tap w(tap)·Σ ĝ(p) over the pixels p whose p + tap is inside the grid: the sum of ĝ
    (``bias_grad``) less its first or last row and column where the tap reaches past them, read off ĝ's
    borders (fp32 [C])."""
    grid, ends, zero = grad_pre.unflatten(1, (height, width)), [0, -1], torch.zeros_like(bias_grad)
    edge_rows = grid[:, ends].float().sum(dim=(0, 2))  # [2, C]: the first and last rows
    edge_cols = grid[:, :, ends].float().sum(dim=(0, 1))
    # a tap above (below) leaves out the first (last) row; one to the left (right), the first (last) column
    rows = torch.stack([edge_rows[0], zero, edge_rows[1]])
    cols = torch.stack([edge_cols[0], zero, edge_cols[1]])
    corners = torch.zeros(3, 3, grid.shape[-1], dtype=torch.float32, device=grid.device)
    corners[::2, ::2] = grid[:, ends][:, :, ends].float().sum(dim=0)
    inside = bias_grad - rows[:, None] - cols[None, :] + corners  # [3, 3, C]: Σ ĝ(p), p + tap inside
    return (weight.reshape(-1, 9).float() * inside.flatten(0, 1).t()).sum(dim=1)


@custom_op("segattn::depthwise_gelu_backward", mutates_args=())
def depthwise_gelu_backward(
    grad: Tensor, x: Tensor, input_bias: Tensor, weight: Tensor, bias: Tensor, height: int, width: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(ĝ, ∂input_bias, ∂weight, ∂bias) of ``depthwise_conv_gelu`` from its output's gradient: ĝ, the
    pre-activation's gradient (recomputed), in x's dtype; the others in their parameters' dtypes."""
    batch, _, channels = x.shape
    grad_pre = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    block_p, block_c = blocks(channels, x.is_cuda, accumulating=True)
    pixel_blocks = triton.cdiv(height * width, block_p)
    channel_blocks = triton.cdiv(channels, block_c)
    programs = backward_programs(x, batch * pixel_blocks, channel_blocks)
    partials = torch.empty(programs, 10, channels, dtype=torch.float32, device=x.device)
    gelu_backward_kernel[(programs, channel_blocks)](
        x, input_bias.contiguous(), grad, weight.contiguous(), bias.contiguous(), grad_pre, partials,
        *x.stride(), *grad.stride(), channels, height, width, pixel_blocks, batch * pixel_blocks,
        BLOCK_P=block_p, BLOCK_C=block_c, num_warps=NUM_WARPS,
    )  # fmt: skip
    sums = partials.sum(dim=0)  # copies: an operator's results may not share storage
    grad_weight = sums[:9].t().reshape(weight.shape).to(weight.dtype)
    grad_input_bias = input_bias_grad(grad_pre, sums[9], weight, height, width)
    return (
        grad_pre,
        grad_input_bias.to(input_bias.dtype),
        grad_weight.clone(memory_format=torch.contiguous_format),
        sums[9].to(bias.dtype, copy=True),
    )


@register_fake("segattn::depthwise_gelu_backward")
def _(grad, x, input_bias, weight, bias, height, width):
    grad_pre = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return (
        grad_pre,
        input_bias.new_empty(input_bias.shape),
        weight.new_empty(weight.shape),
        bias.new_empty(bias.shape),
    )


@custom_op("segattn::depthwise_conv_input_grad", mutates_args=())
def depthwise_conv_input_grad(grad_pre: Tensor, weight: Tensor, height: int, width: int) -> Tensor:
    """∂x = Σ_tap w(−tap)·ĝ(p + tap), the depthwise conv of ĝ with the flipped weights: [B, N, C]."""
    return conv(grad_pre, weight.flip(-2, -1), height, width, biases=None)


@register_fake("segattn::depthwise_conv_input_grad")
def _(grad_pre, weight, height, width):
    return torch.empty(grad_pre.shape, dtype=grad_pre.dtype, device=grad_pre.device)


def save_inputs(ctx, inputs: tuple, output: Tensor) -> None:
    x, input_bias, weight, bias, height, width = inputs
    ctx.save_for_backward(x, input_bias, weight, bias)
    ctx.hw = height, width


def backward(ctx, grad: Tensor) -> tuple:
    x, input_bias, weight, bias = ctx.saved_tensors
    ops = torch.ops.segattn
    grad_pre, *grad_params = ops.depthwise_gelu_backward.default(grad, x, input_bias, weight, bias, *ctx.hw)
    grad_x = ops.depthwise_conv_input_grad.default(grad_pre, weight, *ctx.hw)
    return grad_x, *grad_params, None, None


register_autograd("segattn::depthwise_conv_gelu", backward, setup_context=save_inputs)
