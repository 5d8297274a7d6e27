"""Image operations on a band, made to equal the same operation on the whole image, row for row.

``BandOps`` is a ``TorchFunctionMode``: while it is active every ``conv2d``, ``max_pool2d``, ``interpolate``
and ``batch_norm`` call, in segattn's layers and in timm's CNNs alike, takes the halo rows it needs from
the neighbouring bands (zeros, −inf or the edge row only at the image's true top and bottom) and
BatchNorm takes its statistics over the whole group. Operations whose result needs the whole image at once
and have no band form here are refused by name instead of silently computing per band.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

from .bands import BandGroup, Split, active_split
from .collectives import exchange_halos, group_sum


def _pair(value: int | tuple[int, ...] | list[int]) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[-1]))


def with_halos(x: Tensor, top: int, bottom: int, group: BandGroup, edge: str | float) -> Tensor:
    """Band ``x`` [B, C, h, W] with ``top`` rows from above and ``bottom`` rows from below attached; at the
    image's edges the rows are ``edge``: a constant fill value, or "replicate" for copies of the edge row."""
    if top == 0 and bottom == 0:
        return x
    above, below = exchange_halos(x, top, bottom, group)
    if group.above is None and top:
        above = (
            x[:, :, :1].expand(-1, -1, top, -1)
            if edge == "replicate"
            else x.new_full((*above.shape[:2], top, x.shape[3]), edge)
        )
    if group.below is None and bottom:
        below = (
            x[:, :, -1:].expand(-1, -1, bottom, -1)
            if edge == "replicate"
            else x.new_full((*below.shape[:2], bottom, x.shape[3]), edge)
        )
    return torch.cat([above, x, below], dim=2)


def window_halos(
    kernel: int, stride: int, padding: int, dilation: int, rows: int, op: str
) -> tuple[int, int]:
    """Rows a sliding window (kernel, stride, padding, dilation along H) needs above and below a band of
    ``rows`` rows so that the band's outputs are exactly rows/stride rows of the whole image's."""
    extent = dilation * (kernel - 1) + 1
    top, bottom = padding, max(0, extent - stride - padding)
    if rows % stride or bottom > padding:
        raise ValueError(
            f"{op} with kernel {kernel}, stride {stride}, padding {padding} along the rows does not split "
            f"into bands of {rows} rows (band heights must be multiples of the stride, outputs H/stride rows)"
        )
    return top, bottom


def band_conv2d(
    split: Split,
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> Tensor:
    """conv2d with zero padding along the rows replaced by halo rows (zeros at the image's edges)."""
    (stride_h, stride_w), (dil_h, dil_w) = _pair(stride), _pair(dilation)
    kernel_h, kernel_w = weight.shape[-2:]
    if isinstance(padding, str):
        if padding == "valid":
            pad_h = pad_w = 0
        elif stride_h == stride_w == 1:  # "same"
            pad_h, pad_w = dil_h * (kernel_h - 1) // 2, dil_w * (kernel_w - 1) // 2
        else:
            raise ValueError(f"conv2d padding={padding!r} with stride {stride} has no band form")
    else:
        pad_h, pad_w = _pair(padding)
    top, bottom = window_halos(kernel_h, stride_h, pad_h, dil_h, input.shape[2], "conv2d")
    x = with_halos(input, top, bottom, split.group, 0.0)
    return F.conv2d(x, weight, bias, (stride_h, stride_w), (0, pad_w), (dil_h, dil_w), groups)


def pooling_band(
    split: Split, input: Tensor, op: str, kernel_size: Any, stride: Any, padding: Any, dilation: Any
) -> tuple[Tensor, tuple[int, int], tuple[int, int], tuple[int, int]]:
    """The band with the rows a pooling window needs attached (−inf at the image's edges for max pooling,
    zeros for average pooling, as their implicit padding), and the window's kernel, strides and padding
    with the row padding taken out."""
    kernel, (pad_h, pad_w) = _pair(kernel_size), _pair(padding)
    strides = _pair(kernel_size if stride is None or stride == [] else stride)
    top, bottom = window_halos(kernel[0], strides[0], pad_h, _pair(dilation)[0], input.shape[2], op)
    fill = float("-inf") if op == "max_pool2d" else 0.0
    return with_halos(input, top, bottom, split.group, fill), kernel, strides, (0, pad_w)


def band_max_pool2d(
    split: Split,
    input: Tensor,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Tensor:
    """max_pool2d with its implicit −inf padding along the rows replaced by halo rows."""
    if ceil_mode or return_indices:
        raise ValueError("max_pool2d with ceil_mode or return_indices has no band form")
    x, kernel, strides, pads = pooling_band(
        split, input, "max_pool2d", kernel_size, stride, padding, dilation
    )
    return F.max_pool2d(x, kernel, strides, pads, dilation)


def band_avg_pool2d(
    split: Split,
    input: Tensor,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> Tensor:
    """avg_pool2d with its zero padding along the rows replaced by halo rows; ceil_mode changes nothing
    on bands whose height is a multiple of the stride."""
    if _pair(padding)[0] and not count_include_pad:
        raise ValueError(
            "avg_pool2d with count_include_pad=False and padding along the rows has no band form"
        )
    x, kernel, strides, pads = pooling_band(split, input, "avg_pool2d", kernel_size, stride, padding, 1)
    return F.avg_pool2d(x, kernel, strides, pads, ceil_mode, count_include_pad, divisor_override)


def band_interpolate(
    split: Split,
    input: Tensor,
    size: Any = None,
    scale_factor: Any = None,
    mode: str = "nearest",
    align_corners: bool | None = None,
    recompute_scale_factor: bool | None = None,
    antialias: bool = False,
) -> Tensor:
    """Upsampling of a band by a whole factor along the rows: nearest needs no halo; bilinear
    (align_corners=False) one edge-clamped row on each side, cropped off again after upsampling."""
    rows, cols = input.shape[-2:]
    if size is not None:
        out_rows, out_cols = _pair(size)
    else:
        scale_h, scale_w = (
            (scale_factor, scale_factor) if isinstance(scale_factor, float | int) else scale_factor
        )
        out_rows, out_cols = int(rows * scale_h), int(cols * scale_w)
    factor, remainder = divmod(out_rows, rows)
    if remainder or mode not in ("nearest", "bilinear") or align_corners or antialias:
        raise ValueError(
            f"interpolate(mode={mode!r}, align_corners={align_corners}) from {rows} to {out_rows} rows has "
            "no band form: only nearest or bilinear (align_corners=False) upsampling by a whole factor"
        )
    if mode == "nearest":
        return F.interpolate(input, size=(out_rows, out_cols), mode="nearest")
    padded = with_halos(input, 1, 1, split.group, "replicate")
    out = F.interpolate(padded, size=((rows + 2) * factor, out_cols), mode="bilinear", align_corners=False)
    return out[:, :, factor : factor + out_rows]


def band_batch_norm(
    split: Split,
    input: Tensor,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """BatchNorm whose training statistics are those of the whole image (two all-reduces: the sum, then
    the sum of squared deviations); the running statistics are updated from them as torch does."""
    if not training:
        return F.batch_norm(input, running_mean, running_var, weight, bias, False, momentum, eps)
    dims = [0, *range(2, input.dim())]
    shape = [1, -1] + [1] * (input.dim() - 2)
    x = input.float() if input.dtype in (torch.float16, torch.bfloat16) else input  # stats at fp32 or wider
    count = split.band.global_count(x.numel() // x.shape[1])
    mean = group_sum(x.sum(dims), split.group) / count
    var = group_sum((x - mean.view(shape)).square().sum(dims), split.group) / count
    if running_mean is not None and running_var is not None:
        with torch.no_grad():
            running_mean.mul_(1 - momentum).add_(mean.detach(), alpha=momentum)
            running_var.mul_(1 - momentum).add_(var.detach() * count / max(count - 1, 1), alpha=momentum)
    out = (x - mean.view(shape)) * torch.rsqrt(var.view(shape) + eps)
    if weight is not None:
        out = out * weight.view(shape)
    if bias is not None:
        out = out + bias.view(shape)
    return out.to(input.dtype)


def _refuse(name: str) -> Callable[..., Tensor]:
    def refuse(split: Split, *args: Any, **kwargs: Any) -> Tensor:
        raise ValueError(
            f"{name} needs the whole image at once and has no band form; this model cannot be split into "
            "bands (trainer.strategy.name=spatial)"
        )

    return refuse


def _pad(split: Split, input: Tensor, pad: Any, mode: str = "constant", value: float | None = None) -> Tensor:
    if input.dim() == 4 and len(pad) >= 4 and any(pad[2:4]):
        return _refuse("F.pad along the rows")(split)
    return F.pad(input, pad, mode, value)


HANDLERS: dict[Callable[..., Any], Callable[..., Tensor]] = {
    F.conv2d: band_conv2d,
    F.max_pool2d: band_max_pool2d,
    F.interpolate: band_interpolate,
    F.batch_norm: band_batch_norm,
    F.avg_pool2d: band_avg_pool2d,
    F.pad: _pad,
    **{
        fn: _refuse(f"F.{fn.__name__}")
        for fn in (
            F.adaptive_avg_pool2d,
            F.adaptive_max_pool2d,
            F.group_norm,
            F.instance_norm,
            F.unfold,
            F.fold,
            F.scaled_dot_product_attention,
            F.grid_sample,
        )
    },
}


_WHOLE_IMAGE: list[bool] = []


@contextmanager
def whole_image_ops() -> Iterator[None]:
    """Inside a band's forward, run image operations unchanged: for tensors that cover the whole image."""
    _WHOLE_IMAGE.append(True)
    try:
        yield
    finally:
        _WHOLE_IMAGE.pop()


def band_of_embedding(make: Callable[[tuple[int, int]], Tensor], hw: tuple[int, int], stride: int) -> Tensor:
    """``make(hw)``, a [1, H·W, C] embedding of the token grid ``hw`` (tokens ``stride`` pixels apart), e.g. a
    resampled position embedding. On a band it is made for the whole image's grid and sliced to the band's
    rows, so every band sees the rows the whole image would."""
    split = active_split()
    if split is None:
        return make(hw)
    band = split.band.at_stride(stride)
    with whole_image_ops():
        full = make((band.height, hw[1]))
    return full[:, band.start * hw[1] : band.stop * hw[1]]


class BandOps(TorchFunctionMode):
    """A ``TorchFunctionMode`` that routes a band's image operations (forward and recomputation) to their band
    forms for ``split``."""

    def __init__(self, split: Split) -> None:
        super().__init__()
        self.split = split

    def __torch_function__(self, func, types, args=(), kwargs=None):
        handler = HANDLERS.get(func)
        if handler is None or _WHOLE_IMAGE:
            return func(*args, **(kwargs or {}))
        return handler(self.split, *args, **(kwargs or {}))
