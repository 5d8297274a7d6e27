"""Sliding-window geometry shared by the PyTorch and the numpy (onnxruntime) inference paths, the raster
datasets' windows and the config checks of ``inference.*``: below data/ and inference/, which both use it.

Pure Python on purpose: ``segattn.predict`` with an ONNX model must run without importing torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .files import conf_values
from .images import as_hw

MODES = ("whole", "slide")  # how a full image is predicted: one pass, or overlapping windows
PRECISIONS = ("auto", "fp32", "bf16", "fp16")  # inference.precision (segattn.inference.device)
Window = tuple[int, int, int, int]  # (top, bottom, left, right), half-open
NO_WINDOW = "inference.mode=slide needs inference.crop=H or inference.crop=[H,W] (the window size)"


# The ``inference`` config group's keys and defaults, as conf/inference/default.yaml declares them: how a
# whole image is predicted (``infer``'s, ``infer_numpy``'s and ``TrainedModel.logits``' keyword arguments).
INFERENCE_DEFAULTS: dict[str, Any] = conf_values("inference/default")


@dataclass(frozen=True)
class SlideSettings:
    """How windows are laid and combined: the slide arguments of ``infer(mode="slide")``."""

    crop: tuple[int, int]
    stride: tuple[int, int]
    crop_batch_size: int = INFERENCE_DEFAULTS["crop_batch_size"]
    flip: bool = INFERENCE_DEFAULTS["flip"]
    precision: str = INFERENCE_DEFAULTS["precision"]  # windows run on the model's device in it


Rule = tuple[str, Callable[[Any], bool]]  # (what is expected, the check)
SIZE = "a positive size: H or [H, W] in pixels"


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return (is_int(value) or isinstance(value, float)) and math.isfinite(value)


def int_at_least(low: int) -> Callable[[Any], bool]:
    return lambda value: is_int(value) and value >= low


def at_least(low: int, meaning: str = "") -> Rule:
    """The rule of an integer key whose values start at ``low``; ``meaning`` says what a value means."""
    return (f"an integer >= {low}{meaning and ' '}{meaning}", int_at_least(low))


def one_of(choices: Sequence[Any]) -> Rule:
    """The rule of a key that takes one of ``choices``, which its message lists."""
    return (f"one of {', '.join(map(str, choices))}", lambda value: value in choices)


def positive_size(value: Any) -> bool:
    """A size ``images.as_hw`` reads: a side or an [H, W] pair of positive integers."""
    try:
        as_hw(value)
    except ValueError:
        return False
    return True


def optional_size(value: Any) -> bool:
    return value is None or positive_size(value)


INFERENCE: dict[str, Rule] = {  # conf/inference: how train's validation, eval and predict see an image
    "mode": one_of(MODES),
    "crop": (f"null or {SIZE}", optional_size),
    "stride": (f"null or {SIZE}", optional_size),
    "crop_batch_size": at_least(1),
    "scales": (
        "a non-empty list of numbers > 0",
        lambda v: isinstance(v, list | tuple) and bool(v) and all(is_number(x) and x > 0 for x in v),
    ),
    "flip": ("true or false", lambda v: isinstance(v, bool)),
    "precision": one_of(PRECISIONS),
    "batch_size": ("null or an integer >= 1", lambda v: v is None or int_at_least(1)(v)),
}
# The keys of INFERENCE that say how eval and predict run the network rather than how an image is seen:
# train's validation (Lightning's precision, data.val_batch_size) and ``infer`` read neither.
RUNTIME_KEYS = ("precision", "batch_size")


def image_settings(inference: Mapping[str, Any]) -> dict[str, Any]:
    """``inference`` without ``RUNTIME_KEYS``: the keyword arguments of ``infer``."""
    return {key: value for key, value in inference.items() if key not in RUNTIME_KEYS}


def window_starts(size: int, crop: int, stride: int) -> list[int]:
    """Start offsets along one axis: every ``stride`` pixels, the last window snapped to the border.

    A crop larger than the image gives one window covering the whole axis.
    """
    if crop < 1 or stride < 1 or stride > crop:
        raise ValueError(f"slide inference: crop={crop}, stride={stride}; expected 1 <= stride <= crop")
    if size <= crop:
        return [0]
    starts = list(range(0, size - crop, stride))
    starts.append(size - crop)
    return starts


def slide_windows(height: int, width: int, crop: tuple[int, int], stride: tuple[int, int]) -> list[Window]:
    """All windows (top, bottom, left, right) that tile an image of ``height`` × ``width``, row-major.

    Every window has the same size: ``crop`` clipped to the image.
    """
    tops = window_starts(height, crop[0], stride[0])
    lefts = window_starts(width, crop[1], stride[1])
    crop_h, crop_w = min(crop[0], height), min(crop[1], width)
    return [(top, top + crop_h, left, left + crop_w) for top in tops for left in lefts]


def default_stride(crop: tuple[int, int]) -> tuple[int, int]:
    """Half-window overlap when no stride is given: inner pixels are seen by two windows per axis."""
    return (max(1, crop[0] // 2), max(1, crop[1] // 2))


def slide_settings(inference: Mapping[str, Any]) -> SlideSettings:
    """The ``inference`` config group (plain values) as the settings of an image streamed by window (a
    raster, strip by strip): window, stride (default half the window), batch, flip and precision.
    ValueError naming the key when there is no window, or multi-scale TTA, which a stream does not take."""
    settings = {**INFERENCE_DEFAULTS, **inference}
    if settings["crop"] is None:
        raise ValueError(NO_WINDOW)
    if list(settings["scales"] or [1.0]) != [1.0]:
        raise ValueError(
            f"inference.scales={list(settings['scales'])}: a raster streamed by window takes flip TTA only; "
            "set inference.scales=[1.0]"
        )
    crop, stride = as_hw(settings["crop"], "inference.crop"), settings["stride"]
    return SlideSettings(
        crop,
        default_stride(crop) if stride is None else as_hw(stride, "inference.stride"),
        int(settings["crop_batch_size"]),
        bool(settings["flip"]),
        str(settings["precision"]),
    )


def scaled_size(height: int, width: int, scale: float) -> tuple[int, int]:
    """Image size at a TTA scale, rounded, at least one pixel."""
    if scale <= 0:
        raise ValueError(f"test-time scale {scale}; expected a positive number")
    return max(1, round(height * scale)), max(1, round(width * scale))


__all__ = [
    "INFERENCE_DEFAULTS",
    "PRECISIONS",
    "RUNTIME_KEYS",
    "SlideSettings",
    "Window",
    "default_stride",
    "image_settings",
    "scaled_size",
    "slide_settings",
    "slide_windows",
    "window_starts",
]
