"""Depthwise stride-1 'same' convolution on channels-last grids, with a fast CPU backward for kernels over
3×3: FLatten's depthwise conv on V and Mix-FFN's 3×3 conv share it. Mix-FFN's fc1 bias, conv and GELU
also have a Triton operator (``linear_conv_gelu``, ``depthwise_triton``), and the whole Mix-FFN an opt-in
form (``mix_ffn``, ``mix_ffn_triton``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from .dtypes import matmul_dtype
from .fast_path import FUNCTION, TRITON, choose_path
from .grid import HW, from_grid, to_grid

MAX_FFN_CHANNELS = 256  # the widest tokens ``mix_ffn``'s operators take: at 512 one spilled in fp32


def dense_channels_last(images: Tensor) -> Tensor:
    """[B, C, H, W] ``images`` as dense channels-last with the standard strides; a view when they are already
    channels-last. A [1, N, C] token tensor viewed as a grid keeps a batch stride of C, and conv2d takes such
    an input for NCHW: it copies it in, computes NCHW, and copies the gradients as well."""
    batch, channels, height, width = images.shape
    pixels = images.contiguous(memory_format=torch.channels_last).permute(0, 2, 3, 1)
    return pixels.reshape(-1).view(batch, height, width, channels).permute(0, 3, 1, 2)


def depthwise_conv(images: Tensor, conv: torch.nn.Conv2d, backend: str | None = None) -> Tensor:
    """``conv`` — depthwise, stride 1, padding k // 2 — on [B, C, H, W] images, run channels-last (input,
    weight and output), so a [B, N, C] token tensor viewed as a grid needs no transpose either way. On CPU in
    eager mode kernels larger than 3×3 take ``DepthwiseConv``'s backward unless ``backend`` (the calling
    module's ``kernel_backend``; None: the environment now) is "plain" (``choose_path``); 3×3 kernels keep
    oneDNN's own depthwise backward, which beats it at that size (measured on Mix-FFN's shapes;
    docs/performance.md)."""
    kernel = conv.weight.shape[-1]
    if conv.groups != images.shape[1] or conv.stride != (1, 1) or conv.padding != (kernel // 2, kernel // 2):
        raise ValueError(f"depthwise_conv: {conv} is not a depthwise stride-1 'same' convolution")
    weight = conv.weight.contiguous(memory_format=torch.channels_last)
    cpu_large = kernel > 3 and images.device.type == "cpu"
    if choose_path(backend, images, function=cpu_large, whole_image=True) == FUNCTION:  # whole: the halos
        return depthwise_conv_function(images, weight=weight, bias=conv.bias)
    return torch.nn.functional.conv2d(
        dense_channels_last(images), weight, conv.bias, padding=conv.padding, groups=conv.groups
    )


def linear_conv_gelu(
    tokens: Tensor, hw: HW, linear: torch.nn.Linear, conv: torch.nn.Conv2d, backend: str | None = None
) -> Tensor:
    """Exact GELU of the 3×3 depthwise ``conv`` of ``linear`` of [B, N, C] ``tokens`` on their ``hw`` grid,
    as [B, N, C'] tokens: Mix-FFN's fc1 and middle. Where ``choose_path`` gives TRITON (CUDA tensors by
    default), the linear's matmul then one operator that adds its bias, reads the tokens in place and keeps
    only them for backward (``depthwise_triton``); else ``linear``, ``depthwise_conv`` and GELU."""
    path = choose_path(backend, tokens, triton_head_dim=1, function=False, whole_image=True)  # whole: halos
    if path == TRITON and conv.kernel_size == (3, 3) and None not in (conv.bias, linear.bias):  # any C
        from . import depthwise_triton  # noqa: F401  (imports triton; registers segattn::depthwise_conv_gelu)

        hidden = F.linear(tokens, linear.weight)
        return torch.ops.segattn.depthwise_conv_gelu.default(hidden, linear.bias, conv.weight, conv.bias, *hw)
    return F.gelu(from_grid(depthwise_conv(to_grid(linear(tokens), hw), conv, backend)))


def mix_ffn(
    tokens: Tensor,
    hw: HW,
    fc1: torch.nn.Linear,
    conv: torch.nn.Conv2d,
    fc2: torch.nn.Linear,
    backend: str | None = None,
    output_read: bool = True,
) -> Tensor:
    """Mix-FFN, ``fc2`` of ``linear_conv_gelu``, on [B, N, C] tokens. Where ``choose_path`` takes the opt-in
    ``ffn`` form (SEGATTN_KERNEL=ffn or triton), for a 3×3 conv with every bias and at most
    ``MAX_FFN_CHANNELS`` token features: fc1's matmul and Triton operators that never write the
    activation or the hidden gradient (``mix_ffn_triton``); that path skips its last operator when the
    output goes unread (``output_read`` False: a recompute in backward, which keeps only what is saved)."""
    path = choose_path(backend, tokens, triton_head_dim=1, function=False, whole_image=True, opt_in="ffn")
    biased = None not in (fc1.bias, conv.bias, fc2.bias)
    if path == TRITON and conv.kernel_size == (3, 3) and biased and tokens.shape[-1] <= MAX_FFN_CHANNELS:
        from .mix_ffn_triton import MixFFNFunction  # imports triton

        parameters = (fc1.weight, fc1.bias, conv.weight, conv.bias, fc2.weight, fc2.bias)
        return MixFFNFunction.apply(tokens, *parameters, *hw, output_read)
    return fc2(linear_conv_gelu(tokens, hw, fc1, conv, backend))


class DepthwiseConv(torch.autograd.Function):
    """conv2d(images, weight, bias, padding=k // 2, groups=C) on [B, C, H, W] (channels-last for speed).

    On CPU oneDNN's depthwise backward-weights pass for kernels over 3×3 is much slower than its forward
    (docs/performance.md), so both gradients are forward convolutions: ∂images = conv with the flipped
    kernel, and ∂weight per image = a depthwise conv of the padded image with the output gradient as a H×W
    kernel, summed over images.
    Under autocast the conv runs in the autocast dtype, as F.conv2d would.
    """

    @staticmethod
    def forward(ctx, images, weight, bias):
        device = images.device.type
        dtype = matmul_dtype(images)
        ctx.dtypes = (images.dtype, weight.dtype, None if bias is None else bias.dtype)
        # dense channels-last operands: given a strided view (a head of a qkv chunk) oneDNN would first
        # convert it to NCHW, a copy that costs more than the convolution
        images = dense_channels_last(images.to(dtype))
        weight = weight.to(dtype)
        bias = None if bias is None else bias.to(dtype)
        ctx.save_for_backward(images, weight)
        with torch.autocast(device, enabled=False):
            return torch.nn.functional.conv2d(
                images, weight, bias, padding=weight.shape[-1] // 2, groups=weight.shape[0]
            )

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        images, weight = ctx.saved_tensors
        image_dtype, weight_dtype, bias_dtype = ctx.dtypes
        pad, channels = weight.shape[-1] // 2, weight.shape[0]
        grad = dense_channels_last(grad.to(images.dtype))
        grad_images = grad_weight = grad_bias = None
        with torch.autocast(images.device.type, enabled=False):
            if ctx.needs_input_grad[0]:
                flipped = weight.flip(-2, -1)
                grad_images = torch.nn.functional.conv2d(grad, flipped, padding=pad, groups=channels)
                grad_images = grad_images.to(image_dtype)
            if ctx.needs_input_grad[1]:
                grad_weight = sum(  # the image padded by k // 2 and correlated with an H×W kernel: k×k
                    torch.nn.functional.conv2d(
                        images[i : i + 1], grad[i].unsqueeze(1), padding=pad, groups=channels
                    )[0]
                    for i in range(images.shape[0])
                )
                grad_weight = grad_weight.unsqueeze(1).to(weight_dtype)
            if bias_dtype is not None and ctx.needs_input_grad[2]:
                grad_bias = grad.sum(dim=(0, 2, 3)).to(bias_dtype)
        return grad_images, grad_weight, grad_bias


def depthwise_conv_function(images: Tensor, *, weight: Tensor, bias: Tensor | None) -> Tensor:
    """conv2d(images, weight, bias, padding=k // 2, groups=C) for [B, C, H, W] ``images`` and a depthwise
    [C, 1, k, k] ``weight`` (odd k), as one autograd node whose backward is made of forward convolutions
    (``DepthwiseConv``); channels-last result, in the autocast dtype under autocast."""
    return DepthwiseConv.apply(images, weight, bias)
