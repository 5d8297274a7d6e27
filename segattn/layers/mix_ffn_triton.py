"""Mix-FFN after fc1's matmul, conv + GELU + fc2, as Triton operators that never write the activation, its
gradient or the hidden gradient: the opt-in ``ffn`` form (``depthwise.mix_ffn``).

With h = tokens·fc1ᵀ (a plain matmul, its bias added to each tap inside the grid, as in
``depthwise_triton``), a = GELU(conv(h + b₁) + b) and out = a·fc2ᵀ + b₂:

- ``segattn::mix_ffn`` (``forward_kernel``): per tile of pixels, a per block of hidden channels (nine taps,
  fp32) times fc2's slice (``tl.dot``, fp32 accumulation) into the tile's output: reads h once, writes out.
  Only the tokens and h are kept for backward, where the plain Mix-FFN keeps a as well.
- ``segattn::mix_ffn_gelu_backward`` (``gelu_backward_kernel``): programs per block of hidden channels
  walk the pixel blocks, recompute the pre-activation, take ∂a = ∂out·fc2 (``tl.dot``) and write
  ĝ = ∂a·GELU'(pre) in h's dtype, with fp32 partials of ∂fc2 = Σ ∂outᵀ·a, of the conv's weight and of its
  bias: reads h, writes ĝ.
- ``segattn::mix_ffn_input_grad`` (``input_grad_kernel``): per tile of pixels, ∂h = the transposed conv of
  ĝ per block of hidden channels, times fc1's slice into ∂tokens: reads ĝ.
- ``segattn::mix_ffn_fc1_grad`` (``fc1_grad_kernel``): programs per block of hidden channels walk the pixel
  blocks, recompute ∂h and keep fp32 partials of ∂fc1 = Σ ∂hᵀ·tokens and ∂b₁ = Σ ∂h: reads ĝ.

Six passes over the hidden tensor a step (h written by fc1 and read forward; read, ĝ written and read twice
backward) where the plain operator with fc1's and fc2's matmuls makes thirteen. Partials are summed by the
caller in a fixed order: deterministic, no atomics.

TRITON_INTERPRET=1 (set before triton is first imported) runs the kernels on the CPU. This module imports
triton, so ``depthwise`` loads it on first use.
"""

# ruff: noqa: N803  (upper case: Triton's convention for compile-time constants)

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor
from torch.library import custom_op, register_fake

from .depthwise_triton import INV_SQRT_2PI, SQRT_HALF, backward_programs, conv_tile, load_tile
from .head_triton import dot_operand
from .recompute import placeholder

NUM_WARPS = 8  # at 4 the walking kernels spilled in fp32 (tests/attention/test_triton_compile.py)


@triton.jit
def matrix_tile(ptr, rows, cols, rows_ok, cols_ok, stride_row, stride_col):
    """[rows, cols] of a matrix in fp32, 0 outside it."""
    offsets = rows[:, None] * stride_row + cols[None, :] * stride_col
    return tl.load(ptr + offsets, mask=rows_ok[:, None] & cols_ok[None, :], other=0.0).to(tl.float32)


@triton.jit
def token_tile(batch, pixels, features, features_ok, N, C):
    """Offsets and mask of a [pixels, features] tile of image ``batch`` in a contiguous [B, N, C] tensor."""
    offsets = (batch * N + pixels.to(tl.int64))[:, None] * C + features[None, :]
    return offsets, (pixels < N)[:, None] & features_ok[None, :]


@triton.jit
def pre_activation(h_base, hb_ptr, cw_ptr, cb_ptr, rows, cols, channels, ok, shn, shc, H, W):
    """conv(h + b₁) + b at (rows, cols) for a block of hidden channels, [pixels, channels] fp32."""
    shift = tl.load(hb_ptr + channels, mask=ok, other=0.0).to(tl.float32)
    pre = conv_tile(h_base, cw_ptr, rows, cols, channels, ok, shn, shc, H, W, shift, True)
    return pre + tl.load(cb_ptr + channels, mask=ok, other=0.0).to(tl.float32)[None, :]


@triton.jit
def hidden_grad(dpre_base, cwf_ptr, rows, cols, channels, ok, HIDDEN, H, W):
    """∂h at (rows, cols): the depthwise conv of ĝ (contiguous [N, HIDDEN]) with the flipped weights; 0 past
    the last row, whose taps above reach into the grid."""
    zeros = tl.zeros([channels.shape[0]], dtype=tl.float32)
    grad = conv_tile(dpre_base, cwf_ptr, rows, cols, channels, ok, HIDDEN, 1, H, W, zeros, False)
    return tl.where((rows < H)[:, None], grad, 0.0)


@triton.jit
def forward_kernel(
    h_ptr, hb_ptr, cw_ptr, cb_ptr, w2_ptr, b2_ptr, out_ptr, shb, shn, shc, HIDDEN, C, H, W, pixel_blocks,
    BLOCK_P: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr, COMPILED: tl.constexpr,
):  # fmt: skip
    block = tl.program_id(0)
    batch = (block // pixel_blocks).to(tl.int64)
    pixels = (block % pixel_blocks) * BLOCK_P + tl.arange(0, BLOCK_P)
    rows, cols = pixels // W, pixels % W  # past the last pixel: rows ≥ H, masked as outside
    outs = tl.arange(0, BLOCK_C)
    outs_ok = outs < C
    dtype = out_ptr.dtype.element_ty
    acc = tl.zeros([BLOCK_P, BLOCK_C], dtype=tl.float32)
    for start in range(0, HIDDEN, BLOCK_H):
        channels = start + tl.arange(0, BLOCK_H)
        ok = channels < HIDDEN
        pre = pre_activation(
            h_ptr + batch * shb, hb_ptr, cw_ptr, cb_ptr, rows, cols, channels, ok, shn, shc, H, W
        )
        activation = 0.5 * pre * (1.0 + tl.math.erf(pre * SQRT_HALF))
        w2 = matrix_tile(
            w2_ptr, channels, outs, ok, outs_ok, 1, HIDDEN
        )  # [hidden, out] of fc2's [out, hidden]
        acc += tl.dot(
            dot_operand(activation, dtype, COMPILED), dot_operand(w2, dtype, COMPILED), input_precision="ieee"
        )
    acc += tl.load(b2_ptr + outs, mask=outs_ok, other=0.0).to(tl.float32)[None, :]
    offsets, mask = token_tile(batch, pixels, outs, outs_ok, H * W, C)
    tl.store(out_ptr + offsets, acc.to(dtype), mask=mask)


@triton.jit
def gelu_backward_kernel(
    g_ptr, h_ptr, hb_ptr, cw_ptr, cb_ptr, w2_ptr, dpre_ptr, part_ptr, dw2_ptr, shb, shn, shc, HIDDEN, C, H, W,
    pixel_blocks, num_blocks, BLOCK_P: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr,
    COMPILED: tl.constexpr,
):  # fmt: skip
    program, programs = tl.program_id(0), tl.num_programs(0)
    channels = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    ok = channels < HIDDEN
    outs = tl.arange(0, BLOCK_C)
    outs_ok = outs < C
    dtype = dpre_ptr.dtype.element_ty
    shift = tl.load(hb_ptr + channels, mask=ok, other=0.0).to(tl.float32)
    w2 = dot_operand(
        matrix_tile(w2_ptr, outs, channels, outs_ok, ok, HIDDEN, 1), dtype, COMPILED
    )  # [out, hidden]
    grad_w2 = tl.zeros([BLOCK_C, BLOCK_H], dtype=tl.float32)
    zeros = tl.zeros([BLOCK_H], dtype=tl.float32)
    taps, bias_grad = (zeros,) * 9, zeros
    for block in range(program, num_blocks, programs):
        batch = (block // pixel_blocks).to(tl.int64)
        pixels = (block % pixel_blocks) * BLOCK_P + tl.arange(0, BLOCK_P)
        rows, cols = pixels // W, pixels % W
        h_base = h_ptr + batch * shb
        pre = pre_activation(h_base, hb_ptr, cw_ptr, cb_ptr, rows, cols, channels, ok, shn, shc, H, W)
        offsets, mask = token_tile(batch, pixels, outs, outs_ok, H * W, C)
        g = dot_operand(tl.load(g_ptr + offsets, mask=mask, other=0.0), dtype, COMPILED)  # [pixels, out]
        cdf = 0.5 * (1.0 + tl.math.erf(pre * SQRT_HALF))
        grad = tl.dot(g, w2, input_precision="ieee") * (cdf + pre * tl.exp(-0.5 * pre * pre) * INV_SQRT_2PI)
        offsets, mask = token_tile(batch, pixels, channels, ok, H * W, HIDDEN)
        tl.store(dpre_ptr + offsets, grad.to(dtype), mask=mask)
        activation = dot_operand(pre * cdf, dtype, COMPILED)
        grad_w2 += tl.dot(tl.trans(g), activation, input_precision="ieee")
        bias_grad += tl.sum(grad, axis=0)
        taps = [  # rebuilt whole: Triton compiles a comprehension over a literal tuple, not a static_range
            taps[t]
            + tl.sum(
                grad
                * load_tile(
                    h_base, rows + t // 3 - 1, cols + t % 3 - 1, channels, ok, shn, shc, H, W, shift, True
                ),
                axis=0,
            )
            for t in (0, 1, 2, 3, 4, 5, 6, 7, 8)
        ]
    part = part_ptr + program * 10 * HIDDEN + channels
    for t in tl.static_range(9):
        tl.store(part + t * HIDDEN, taps[t], mask=ok)
    tl.store(part + 9 * HIDDEN, bias_grad, mask=ok)
    offsets = (program * C + outs).to(tl.int64)[:, None] * HIDDEN + channels[None, :]
    tl.store(dw2_ptr + offsets, grad_w2, mask=outs_ok[:, None] & ok[None, :])


@triton.jit
def input_grad_kernel(
    dpre_ptr, cwf_ptr, w1_ptr, dx_ptr, HIDDEN, C, H, W, pixel_blocks,
    BLOCK_P: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr, COMPILED: tl.constexpr,
):  # fmt: skip
    block = tl.program_id(0)
    batch = (block // pixel_blocks).to(tl.int64)
    pixels = (block % pixel_blocks) * BLOCK_P + tl.arange(0, BLOCK_P)
    rows, cols = pixels // W, pixels % W
    outs = tl.arange(0, BLOCK_C)
    outs_ok = outs < C
    dtype = dpre_ptr.dtype.element_ty
    dpre_base = dpre_ptr + batch * H * W * HIDDEN
    acc = tl.zeros([BLOCK_P, BLOCK_C], dtype=tl.float32)
    for start in range(0, HIDDEN, BLOCK_H):
        channels = start + tl.arange(0, BLOCK_H)
        ok = channels < HIDDEN
        grad_h = hidden_grad(dpre_base, cwf_ptr, rows, cols, channels, ok, HIDDEN, H, W)
        w1 = matrix_tile(w1_ptr, channels, outs, ok, outs_ok, C, 1)  # fc1's [hidden, in]
        acc += tl.dot(
            dot_operand(grad_h, dtype, COMPILED), dot_operand(w1, dtype, COMPILED), input_precision="ieee"
        )
    offsets, mask = token_tile(batch, pixels, outs, outs_ok, H * W, C)
    tl.store(dx_ptr + offsets, acc.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def fc1_grad_kernel(
    dpre_ptr, cwf_ptr, x_ptr, part_ptr, dw1_ptr, HIDDEN, C, H, W, pixel_blocks, num_blocks,
    BLOCK_P: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr, COMPILED: tl.constexpr,
):  # fmt: skip
    program, programs = tl.program_id(0), tl.num_programs(0)
    channels = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    ok = channels < HIDDEN
    outs = tl.arange(0, BLOCK_C)
    outs_ok = outs < C
    dtype = dpre_ptr.dtype.element_ty
    grad_w1 = tl.zeros([BLOCK_H, BLOCK_C], dtype=tl.float32)
    bias_grad = tl.zeros([BLOCK_H], dtype=tl.float32)
    for block in range(program, num_blocks, programs):
        batch = (block // pixel_blocks).to(tl.int64)
        pixels = (block % pixel_blocks) * BLOCK_P + tl.arange(0, BLOCK_P)
        rows, cols = pixels // W, pixels % W
        grad_h = hidden_grad(
            dpre_ptr + batch * H * W * HIDDEN, cwf_ptr, rows, cols, channels, ok, HIDDEN, H, W
        )
        offsets, mask = token_tile(batch, pixels, outs, outs_ok, H * W, C)
        x = dot_operand(tl.load(x_ptr + offsets, mask=mask, other=0.0), dtype, COMPILED)
        grad_w1 += tl.dot(tl.trans(dot_operand(grad_h, dtype, COMPILED)), x, input_precision="ieee")
        bias_grad += tl.sum(grad_h, axis=0)
    tl.store(part_ptr + program * HIDDEN + channels, bias_grad, mask=ok)
    offsets = (program * HIDDEN + channels).to(tl.int64)[:, None] * C + outs[None, :]
    tl.store(dw1_ptr + offsets, grad_w1, mask=ok[:, None] & outs_ok[None, :])


def blocks(hidden: int, channels: int, compiled: bool, walking: bool = False) -> tuple[int, int, int]:
    """(pixels, hidden channels, padded token channels) of a program. Compiled: 16 hidden channels, and 32
    pixels, 16 for the walking kernels (``gelu_backward_kernel``, ``fc1_grad_kernel``: 16 is ``tl.dot``'s
    smallest operand), which at 32 hidden channels spilled in fp32 (ptxas, sm_90, 8 warps; up to 256 token
    channels). Under the interpreter (one program at a time, a fixed cost per operation) 64 pixels and up
    to 256 hidden channels."""
    padded = max(16, triton.next_power_of_2(channels))
    if not compiled:
        return 64, max(16, min(256, triton.next_power_of_2(hidden))), padded
    return 16 if walking else 32, 16, padded


def launch_plan(hidden: Tensor, channels: int, height: int, width: int, walking: bool) -> dict[str, Any]:
    """Blocks, grid sizes and the walking kernels' programs for [B, N, hidden] over ``channels`` features."""
    batch, _, width_hidden = hidden.shape
    block_p, block_h, block_c = blocks(width_hidden, channels, hidden.is_cuda, walking)
    pixel_blocks = triton.cdiv(height * width, block_p)
    hidden_blocks = triton.cdiv(width_hidden, block_h)
    return {
        "constants": {"BLOCK_P": block_p, "BLOCK_H": block_h, "BLOCK_C": block_c, "COMPILED": hidden.is_cuda},
        "pixel_blocks": pixel_blocks,
        "hidden_blocks": hidden_blocks,
        "programs": backward_programs(hidden, batch * pixel_blocks, hidden_blocks),
    }


@custom_op("segattn::mix_ffn", mutates_args=())
def mix_ffn(
    hidden: Tensor,
    input_bias: Tensor,
    conv_weight: Tensor,
    conv_bias: Tensor,
    fc2_weight: Tensor,
    fc2_bias: Tensor,
    height: int,
    width: int,
) -> Tensor:
    """fc2(GELU(depthwise 3×3 conv(hidden + input_bias) + conv_bias)) of [B, N, hidden] on the height × width
    grid (N = H·W, row major; zero padding): contiguous [B, N, out] in hidden's dtype, fp32 inside."""
    channels = fc2_weight.shape[0]
    out = torch.empty(*hidden.shape[:2], channels, dtype=hidden.dtype, device=hidden.device)
    plan = launch_plan(hidden, channels, height, width, walking=False)
    forward_kernel[(hidden.shape[0] * plan["pixel_blocks"],)](
        hidden, input_bias.contiguous(), conv_weight.contiguous(), conv_bias.contiguous(),
        fc2_weight.contiguous(), fc2_bias.contiguous(), out, *hidden.stride(), hidden.shape[-1], channels,
        height, width, plan["pixel_blocks"], **plan["constants"], num_warps=NUM_WARPS,
    )  # fmt: skip
    return out


@register_fake("segattn::mix_ffn")
def _(hidden, input_bias, conv_weight, conv_bias, fc2_weight, fc2_bias, height, width):
    return hidden.new_empty(*hidden.shape[:2], fc2_weight.shape[0])


@custom_op("segattn::mix_ffn_gelu_backward", mutates_args=())
def mix_ffn_gelu_backward(
    grad: Tensor,
    hidden: Tensor,
    input_bias: Tensor,
    conv_weight: Tensor,
    conv_bias: Tensor,
    fc2_weight: Tensor,
    height: int,
    width: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(ĝ, ∂conv_weight, ∂conv_bias, ∂fc2_weight) of ``mix_ffn`` from its output's gradient: ĝ, the
    pre-activation's gradient (recomputed), contiguous in hidden's dtype; the others in their parameters'."""
    channels, width_hidden = fc2_weight.shape
    grad_pre = torch.empty(hidden.shape, dtype=hidden.dtype, device=hidden.device)
    plan = launch_plan(hidden, channels, height, width, walking=True)
    programs = plan["programs"]
    partials = torch.empty(programs, 10, width_hidden, dtype=torch.float32, device=hidden.device)
    fc2_partials = torch.empty(programs, channels, width_hidden, dtype=torch.float32, device=hidden.device)
    gelu_backward_kernel[(programs, plan["hidden_blocks"])](
        grad.to(hidden.dtype).contiguous(), hidden, input_bias.contiguous(), conv_weight.contiguous(),
        conv_bias.contiguous(), fc2_weight.contiguous(), grad_pre, partials, fc2_partials, *hidden.stride(),
        width_hidden, channels, height, width, plan["pixel_blocks"], hidden.shape[0] * plan["pixel_blocks"],
        **plan["constants"], num_warps=NUM_WARPS,
    )  # fmt: skip
    sums = partials.sum(dim=0)
    grad_conv_weight = sums[:9].t().reshape(conv_weight.shape).to(conv_weight.dtype)
    return (
        grad_pre,
        grad_conv_weight.clone(memory_format=torch.contiguous_format),
        sums[9].to(conv_bias.dtype, copy=True),
        fc2_partials.sum(dim=0).to(fc2_weight.dtype),
    )


@register_fake("segattn::mix_ffn_gelu_backward")
def _(grad, hidden, input_bias, conv_weight, conv_bias, fc2_weight, height, width):
    return (
        torch.empty(hidden.shape, dtype=hidden.dtype, device=hidden.device),
        conv_weight.new_empty(conv_weight.shape),
        conv_bias.new_empty(conv_bias.shape),
        fc2_weight.new_empty(fc2_weight.shape),
    )


@custom_op("segattn::mix_ffn_input_grad", mutates_args=())
def mix_ffn_input_grad(
    grad_pre: Tensor, conv_weight: Tensor, fc1_weight: Tensor, height: int, width: int
) -> Tensor:
    """∂tokens = (the depthwise conv of ĝ with the flipped weights)·fc1: [B, N, in] in ĝ's dtype."""
    width_hidden, channels = fc1_weight.shape
    grad_pre = grad_pre.contiguous()
    grad_tokens = grad_pre.new_empty(*grad_pre.shape[:2], channels)
    plan = launch_plan(grad_pre, channels, height, width, walking=False)
    input_grad_kernel[(grad_pre.shape[0] * plan["pixel_blocks"],)](
        grad_pre, conv_weight.flip(-2, -1).contiguous(), fc1_weight.contiguous(), grad_tokens, width_hidden,
        channels, height, width, plan["pixel_blocks"], **plan["constants"], num_warps=NUM_WARPS,
    )  # fmt: skip
    return grad_tokens


@register_fake("segattn::mix_ffn_input_grad")
def _(grad_pre, conv_weight, fc1_weight, height, width):
    return grad_pre.new_empty(*grad_pre.shape[:2], fc1_weight.shape[1])


@custom_op("segattn::mix_ffn_fc1_grad", mutates_args=())
def mix_ffn_fc1_grad(
    grad_pre: Tensor, tokens: Tensor, conv_weight: Tensor, height: int, width: int
) -> tuple[Tensor, Tensor]:
    """(∂fc1_weight, ∂input_bias) in fp32: Σ ∂hᵀ·tokens and Σ ∂h over the pixels, ∂h the depthwise conv of ĝ
    with the flipped weights."""
    width_hidden, channels = grad_pre.shape[-1], tokens.shape[-1]
    grad_pre = grad_pre.contiguous()
    plan = launch_plan(grad_pre, channels, height, width, walking=True)
    programs = plan["programs"]
    partials = torch.empty(programs, width_hidden, dtype=torch.float32, device=grad_pre.device)
    fc1_partials = torch.empty(programs, width_hidden, channels, dtype=torch.float32, device=grad_pre.device)
    fc1_grad_kernel[(programs, plan["hidden_blocks"])](
        grad_pre, conv_weight.flip(-2, -1).contiguous(), tokens.to(grad_pre.dtype).contiguous(), partials,
        fc1_partials, width_hidden, channels, height, width, plan["pixel_blocks"],
        grad_pre.shape[0] * plan["pixel_blocks"], **plan["constants"], num_warps=NUM_WARPS,
    )  # fmt: skip
    return fc1_partials.sum(dim=0), partials.sum(dim=0)


@register_fake("segattn::mix_ffn_fc1_grad")
def _(grad_pre, tokens, conv_weight, height, width):
    fc1 = grad_pre.new_empty(grad_pre.shape[-1], tokens.shape[-1], dtype=torch.float32)
    return fc1, grad_pre.new_empty(grad_pre.shape[-1], dtype=torch.float32)


class MixFFNFunction(torch.autograd.Function):
    """Mix-FFN on [B, N, in] tokens as one autograd node: fc1's matmul (``F.linear`` without its bias, in
    autocast's dtype) and ``mix_ffn``; backward the three operators above and ∂b₂ = Σ ∂out. Keeps the
    tokens and h; without ``output_read`` returns a ``placeholder`` instead of running ``mix_ffn``."""

    @staticmethod
    def forward(
        ctx: Any,
        tokens: Tensor,
        fc1_weight: Tensor,
        fc1_bias: Tensor,
        conv_weight: Tensor,
        conv_bias: Tensor,
        fc2_weight: Tensor,
        fc2_bias: Tensor,
        height: int,
        width: int,
        output_read: bool = True,
    ) -> Tensor:
        hidden = F.linear(tokens, fc1_weight)
        ctx.save_for_backward(tokens, hidden, fc1_weight, fc1_bias, conv_weight, conv_bias, fc2_weight)
        ctx.hw, ctx.dtypes = (height, width), (tokens.dtype, fc1_weight.dtype, fc2_bias.dtype)
        if not output_read:
            return placeholder((*hidden.shape[:2], fc2_weight.shape[0]), hidden, hidden.dtype)
        ops = torch.ops.segattn
        return ops.mix_ffn.default(
            hidden, fc1_bias, conv_weight, conv_bias, fc2_weight, fc2_bias, height, width
        )

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        tokens, hidden, fc1_weight, fc1_bias, conv_weight, conv_bias, fc2_weight = ctx.saved_tensors
        tokens_dtype, fc1_dtype, fc2_bias_dtype = ctx.dtypes
        ops = torch.ops.segattn
        grad_pre, grad_conv_weight, grad_conv_bias, grad_fc2_weight = ops.mix_ffn_gelu_backward.default(
            grad, hidden, fc1_bias, conv_weight, conv_bias, fc2_weight, *ctx.hw
        )
        grad_tokens = None
        if ctx.needs_input_grad[0]:
            grad_tokens = ops.mix_ffn_input_grad.default(grad_pre, conv_weight, fc1_weight, *ctx.hw)
            grad_tokens = grad_tokens.to(tokens_dtype)
        grad_fc1_weight, grad_fc1_bias = ops.mix_ffn_fc1_grad.default(grad_pre, tokens, conv_weight, *ctx.hw)
        return (
            grad_tokens,
            grad_fc1_weight.to(fc1_dtype),
            grad_fc1_bias.to(fc1_bias.dtype),
            grad_conv_weight,
            grad_conv_bias,
            grad_fc2_weight,
            grad.sum(dim=(0, 1), dtype=torch.float32).to(fc2_bias_dtype),
            None,
            None,
            None,
        )
