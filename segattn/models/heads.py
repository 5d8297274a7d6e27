"""Segmentation heads: encoder features (list of [B, C_i, H_i, W_i], shallow to deep) → class logits.

Each head returns logits at its own stride; the Segmentor resizes them to the input. ``channels`` is the
hidden width of heads that have one.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from timm.layers import BatchNormAct2d, ConvNormAct
from timm.models.efficientvit_mit import MBConv, ResidualBlock
from torch import Tensor, nn

from ..layers import TRITON, choose_path, kernel_backend, matmul_operand, resample_grid
from ..layers.fast_path import MAX_HEAD_DIM
from ..layers.recompute import placeholder, return_unread


def resized(x: Tensor, size: torch.Size) -> Tensor:
    """``x`` bilinearly resized to ``size`` (as it is when already that size)."""
    return x if x.shape[-2:] == size else F.interpolate(x, size=size, mode="bilinear", align_corners=False)


class LinearHead(nn.Module):
    """Segmenter's linear decoder: a 1×1 conv classifier on the deepest feature map."""

    def __init__(self, in_channels: list[int], num_classes: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.dropout = nn.Dropout2d(dropout)
        self.classifier = nn.Conv2d(in_channels[-1], num_classes, 1)

    def forward(self, features: list[Tensor]) -> Tensor:
        return self.classifier(self.dropout(features[-1]))


class PUPHead(nn.Module):
    """SETR progressive upsampling: on the deepest map, log2(stride) rounds of 3×3 conv-BN-ReLU + 2×
    bilinear upsampling, then a 1×1 classifier near full resolution (Zheng et al. 2021, arXiv 2012.15840)."""

    def __init__(
        self,
        in_channels: list[int],
        in_strides: list[int],
        num_classes: int,
        channels: int = 256,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        self.num_classes = num_classes
        rounds = max(1, round(math.log2(in_strides[-1])))
        self.convs = nn.ModuleList(
            ConvNormAct(in_channels[-1] if i == 0 else channels, channels, 3) for i in range(rounds)
        )
        self.dropout = nn.Dropout2d(dropout)
        self.classifier = nn.Conv2d(channels, num_classes, 1)

    def forward(self, features: list[Tensor]) -> Tensor:
        x = features[-1]
        for conv in self.convs:
            x = F.interpolate(conv(x), scale_factor=2.0, mode="bilinear", align_corners=False)
        return self.classifier(self.dropout(x))


class MLPHead(nn.Module):
    """SegFormer all-MLP decoder: per-level linear projection to ``channels``, upsampling to the shallowest
    level, concatenation, 1×1 conv-BN-ReLU fusion, 1×1 classifier (Xie et al. 2021, arXiv 2105.15203).

    Computed in an equivalent order that moves fewer bytes. Projections, fusion conv and bilinear upsampling
    are linear, so each level's projection is folded into its slice of the fusion weight and no
    [B, levels·channels, H/4, W/4] concatenation exists. A level narrower than ``channels`` is cheaper to
    upsample before its projection: those are upsampled as they come and stacked; a wider one is projected
    at its own resolution, then upsampled, and these are summed with every bias. The fused map is one
    batched matmul of the stack added onto that sum, not a full-resolution sum per level. In training,
    Dropout2d's channel mask is drawn as it would be and folded into the classifier's weight per image, and
    the ReLU goes with the classifier (``ReluClassifier``), so backward holds no more maps than the plain
    order did. Same parameters (``fuse`` is the conv and BN; the ReLU has none) and function.
    ``kernel_backend`` (read when built) decides how the levels are upsampled (``upsampled``) and whether
    the BN, ReLU and classifier of a training step run as Triton operators (``takes_head_operators``).
    """

    def __init__(
        self, in_channels: list[int], num_classes: int, channels: int = 256, dropout: float = 0.1
    ) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.proj = nn.ModuleList(nn.Conv2d(c, channels, 1) for c in in_channels)
        self.fuse = ConvNormAct(channels * len(in_channels), channels, 1, apply_act=False)
        self.dropout = nn.Dropout2d(dropout)
        self.classifier = nn.Conv2d(channels, num_classes, 1)
        self.kernel_backend = kernel_backend()

    def forward(self, features: list[Tensor]) -> Tensor:
        fused = self.fused(features)  # fuse's conv; its BN and the ReLU follow here
        if not self.training:
            return self.classifier(self.fuse.bn(fused).relu_())
        ones = torch.ones(*fused.shape[:2], 1, 1, dtype=fused.dtype, device=fused.device)
        keep = self.dropout(ones).flatten(1)  # the channel mask Dropout2d draws for the fused map
        weight = self.classifier.weight.flatten(1) * keep[:, None, :]  # [B, classes, channels]
        read = not return_unread(self)  # recomputed in backward: the logits are not needed
        if self.takes_head_operators(fused):
            from ..layers.head_triton import batch_norm_relu_classifier  # imports triton

            return batch_norm_relu_classifier(fused, self.fuse.bn, weight, self.classifier.bias, read)
        return ReluClassifier.apply(self.fuse.bn(fused), weight, self.classifier.bias, read)

    def takes_head_operators(self, fused: Tensor) -> bool:
        """Whether a training step on ``fused`` runs BN, ReLU and classifier as ``layers.head_triton``'s
        operators: where ``choose_path`` takes the opt-in ``head`` form (SEGATTN_KERNEL=head or triton), for
        a plain BatchNorm (timm's without act or dropout; not a SyncBatchNorm) with running statistics, at
        most ``MAX_HEAD_DIM`` classes and more than one value per channel (else BN's own error)."""
        bn = self.fuse.bn  # built without act or dropout (apply_act=False); another class once converted
        if type(bn) is not BatchNormAct2d or not bn.track_running_stats or fused[:, 0].numel() < 2:
            return False
        if self.num_classes > MAX_HEAD_DIM:
            return False
        path = choose_path(  # whole: the batch statistics are over every pixel
            self.kernel_backend, fused, triton_head_dim=1, function=False, whole_image=True, opt_in="head"
        )
        return path == TRITON

    def fused(self, features: list[Tensor]) -> Tensor:
        """The fusion conv's output before its BN and ReLU: [B, channels, H_0, W_0]."""
        size, channels = features[0].shape[-2:], self.fuse.conv.out_channels
        fuse_weights = self.fuse.conv.weight.flatten(1).split(channels, dim=1)
        weights = [w @ proj.weight.flatten(1) for w, proj in zip(fuse_weights, self.proj, strict=True)]
        bias = sum(w @ proj.bias for w, proj in zip(fuse_weights, self.proj, strict=True))
        narrow = [i for i, feature in enumerate(features) if feature.shape[1] < channels]
        summed = None  # the wide levels, each projected, upsampled, and summed, with every bias
        for i in (i for i in range(len(features)) if i not in narrow):
            level = F.conv2d(features[i], weights[i][..., None, None], bias if summed is None else None)
            level = self.upsampled(level, size).flatten(2)
            summed = level if summed is None else summed + level
        if not narrow:
            return summed.unflatten(2, size)
        # each in the dtype the matmul reads, cast before the concatenation rather than after it
        levels = [matmul_operand(self.upsampled(features[i], size)) for i in narrow]
        stack = (levels[0] if len(levels) == 1 else torch.cat(levels, dim=1)).flatten(2)
        del levels  # the upsampled levels are in the stack now: free them before the matmul's output
        weight = torch.cat([weights[i] for i in narrow], dim=1).expand(stack.shape[0], -1, -1)
        summed = bias[:, None] if summed is None else summed
        return torch.baddbmm(summed, weight, stack).unflatten(2, size)

    def upsampled(self, level: Tensor, size: torch.Size) -> Tensor:
        """``level`` bilinearly resized to ``size``: ``resized``, or where ``choose_path`` takes the opt-in
        ``upsample`` form (SEGATTN_KERNEL=upsample or triton), cast to autocast's dtype (when on) and
        resampled as two interpolation-matrix matmuls (``resample_grid``), whose backward is matmuls too,
        where a CUDA device's bilinear backward is a generic kernel with atomics."""
        path = choose_path(  # whole: a band's upsampling needs its neighbours' rows (parallel.ops)
            self.kernel_backend, level, triton_head_dim=1, function=False, whole_image=True, opt_in="upsample"
        )
        if path != TRITON:
            return resized(level, size)
        level = matmul_operand(level)
        return level if level.shape[-2:] == size else resample_grid(level, size)


class ReluClassifier(torch.autograd.Function):
    """ReLU, then a 1×1 classifier with a weight per image ([B, classes, channels]): the gradient of the
    ReLU's input is masked in place, so one full-resolution map fewer is alive in backward than autograd's
    own ReLU backward needs. Runs in the dtype autocast gives the classifier; gradients in the inputs'.
    Without ``output_read`` the logits are left unwritten."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor, output_read: bool = True) -> Tensor:
        y = x.relu()
        ctx.save_for_backward(y, weight)
        ctx.bias_dtype = bias.dtype
        if not output_read:
            return placeholder((y.shape[0], weight.shape[1], *y.shape[2:]), y, matmul_operand(weight).dtype)
        logits = torch.baddbmm(bias[:, None], weight, y.flatten(2))
        return logits.unflatten(2, x.shape[-2:])

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        y, weight = ctx.saved_tensors
        grad, activations = grad.flatten(2), y.flatten(2).to(grad.dtype)
        grad_y = torch.bmm(weight.to(grad.dtype).transpose(1, 2), grad).to(y.dtype).view_as(y)
        # in y's memory layout: given another, BatchNorm's CPU backward (torch 2.14) is wrong for a
        # channels-last input of one image with batch stride C (the wide levels' sum on PVT features)
        grad_x = grad_y if grad_y.stride() == y.stride() else torch.empty_like(y)
        torch.ops.aten.threshold_backward.grad_input(grad_y, y, 0, grad_input=grad_x)
        grad_weight = torch.bmm(grad, activations.transpose(1, 2)).to(weight.dtype)
        return grad_x, grad_weight, grad.sum((0, 2)).to(ctx.bias_dtype), None


class FCNHead(nn.Module):
    """Auxiliary FCN head on one level (the second deepest): 3×3 conv-BN-ReLU, dropout, 1×1 classifier."""

    def __init__(
        self, in_channels: list[int], num_classes: int, channels: int = 256, dropout: float = 0.1
    ) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.level = -2 if len(in_channels) > 1 else -1
        self.conv = ConvNormAct(in_channels[self.level], channels, 3)
        self.dropout = nn.Dropout2d(dropout)
        self.classifier = nn.Conv2d(channels, num_classes, 1)

    def forward(self, features: list[Tensor]) -> Tensor:
        return self.classifier(self.dropout(self.conv(features[self.level])))


class EfficientViTHead(nn.Module):
    """EfficientViT-Seg's head (Cai et al. 2023, arXiv 2205.14756): the three deepest levels (strides 8, 16,
    32 on EfficientViT) each through a 1×1 conv + BN onto ``channels``, bilinearly upsampled to the
    shallowest of them and summed; ``depth`` residual MBConv blocks (hardswish) there; a 1×1 conv-BN-
    hardswish widening to ``channels · final_expand``; dropout; 1×1 classifier. Logits at that level's stride.
    """

    def __init__(
        self,
        in_channels: list[int],
        num_classes: int,
        channels: int = 32,
        depth: int = 1,
        expand_ratio: float = 4.0,
        final_expand: float = 4.0,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.levels = list(range(len(in_channels)))[-3:]
        self.inputs = nn.ModuleList(
            ConvNormAct(in_channels[i], channels, 1, apply_act=False) for i in self.levels
        )
        self.middle = nn.Sequential(
            *(
                ResidualBlock(
                    MBConv(
                        channels,
                        channels,
                        expand_ratio=expand_ratio,
                        act_layer=(nn.Hardswish, nn.Hardswish, None),
                    ),
                    nn.Identity(),
                )
                for _ in range(depth)
            )
        )
        final = round(channels * final_expand)
        self.final = ConvNormAct(channels, final, 1, act_layer=nn.Hardswish)
        self.dropout = nn.Dropout2d(dropout)
        self.classifier = nn.Conv2d(final, num_classes, 1)

    def forward(self, features: list[Tensor]) -> Tensor:
        size = features[self.levels[0]].shape[-2:]
        fused = None
        for level, project in zip(self.levels, self.inputs, strict=True):
            x = resized(project(features[level]), size)
            fused = x if fused is None else fused + x
        return self.classifier(self.dropout(self.final(self.middle(fused))))
