"""The variants and models a bench part runs (``Spec``), token counts (``64k``) and image sizes."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class Spec:
    """A registry name plus constructor options; ``label`` is the text it was parsed from. ``compiled``:
    time it under ``torch.compile`` (label ``<text>+compile``); ``kernel``: the SEGATTN_KERNEL value its
    modules are built under ("auto": as the environment says; label ``<text>@<kernel>``)."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)
    label: str = ""
    compiled: bool = False
    kernel: str = "auto"


STEP_OPTIONS = ("loss_chunk_rows",)  # options of a model spec for its training step, not for build_model


def with_compiled(specs: list[Spec], compile: bool) -> list[Spec]:
    """``specs``, each followed by its compiled twin when ``compile``: ``flatten``, ``flatten+compile``."""
    if not compile:
        return specs
    return [s for spec in specs for s in (spec, replace(spec, label=f"{spec.label}+compile", compiled=True))]


def with_kernels(specs: list[Spec], kernels: list[str]) -> list[Spec]:
    """``specs`` with a variant that has a Triton path once per kernel path (``linear@torch``,
    ``linear@triton``; the label only names the path when there are several), the others once ("auto")."""
    from ..attention import attention_class

    out = []
    for spec in specs:
        paths = kernels if attention_class(spec.name).triton_path else ["auto"]
        for kernel in paths:
            label = f"{spec.label}@{kernel}" if len(paths) > 1 else spec.label
            out.append(replace(spec, label=label, kernel=kernel))
    return out


def compile_options() -> dict[str, Any]:
    """``torch.compile`` keyword arguments of every compiled case: one fixed-shape graph per size, dtype and
    mode, as a training run at one crop size gets. The recompile limit is raised for a bench's many sizes, and
    hitting it fails rather than timing eager code under a ``+compile`` label."""
    import torch._dynamo

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    return {"dynamic": False}


def spec_of(value: str | Mapping[str, Any]) -> Spec:
    """A variant or model as the bench's config lists it: a registry name (``flatten``), or a mapping of
    ``name`` and constructor options, with an optional ``label`` that names it in tables and run
    directories (default: ``name:key=value:...``, e.g. ``softmax:sr_ratios=[1,1,1,1]``)."""
    if isinstance(value, str):
        return Spec(value, {}, value)
    options = dict(value)
    name = options.pop("name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"{dict(value)}: expected a name (e.g. {{name: linear, feature_map: relu}})")
    label = options.pop("label", None)
    shown = [f"{key}={json.dumps(option, separators=(',', ':')) if not isinstance(option, str) else option}"
             for key, option in options.items()]  # fmt: skip
    return Spec(name, options, str(label) if label is not None else ":".join([name, *shown]))


def parse_count(text: str) -> int:
    """``4096``, ``4k`` (= 4096) or ``1m`` (= 1048576) as an integer."""
    multiplier = {"k": 1 << 10, "m": 1 << 20}.get(text[-1:].lower(), 1)
    digits = text[:-1] if multiplier > 1 else text
    try:
        value = int(digits) * multiplier
    except ValueError:
        raise ValueError(f"{text!r} is not a count; expected an integer such as 4096, 4k or 1m") from None
    if value <= 0:
        raise ValueError(f"{text!r} must be positive")
    return value


def parse_image_size(text: str | int) -> tuple[int, int]:
    """``2048`` (square) or ``4288x2848`` (width x height, as image sizes are written) as (height, width)."""
    width, sep, height = str(text).lower().replace("×", "x").partition("x")
    try:
        sides = (int(height), int(width)) if sep else (int(width), int(width))
    except ValueError:
        raise ValueError(
            f"{text!r} is not an image size; expected a side (2048) or WIDTHxHEIGHT (4288x2848)"
        ) from None
    if min(sides) <= 0:
        raise ValueError(f"{text!r}: image sides must be positive")
    return sides


def format_image_size(height: int, width: int) -> str:
    """``2048²`` for a square image, ``4288×2848`` (width × height) otherwise."""
    return f"{height}²" if height == width else f"{width}×{height}"


def size_label(height: int, width: int) -> str:
    """The ``size`` column: ``2048`` for a square image, ``4288x2848`` (width x height) otherwise."""
    return str(height) if height == width else f"{width}x{height}"


@contextlib.contextmanager
def kernel_path(kernel: str) -> Iterator[None]:
    """SEGATTN_KERNEL = ``kernel`` while a model is built (its modules read it then); "auto" leaves it."""
    if kernel == "auto":
        yield
        return
    from ..layers import KERNEL_ENV

    before = os.environ.get(KERNEL_ENV)
    os.environ[KERNEL_ENV] = kernel
    try:
        yield
    finally:
        if before is None:
            del os.environ[KERNEL_ENV]
        else:
            os.environ[KERNEL_ENV] = before


def grid_for(tokens: int) -> tuple[int, int]:
    """The most square (H, W) with H·W = tokens, H ≤ W."""
    height = int(tokens**0.5)
    while tokens % height:
        height -= 1
    return height, tokens // height


def format_count(value: int) -> str:
    """Token and pixel counts as exact integers with thousands separators: 65536 -> '65,536'."""
    return f"{value:,}"
