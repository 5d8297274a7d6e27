"""Command-line specs: ``name:key=value:key=value`` for variants and models, ``64k`` for token counts."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import yaml


@dataclass(frozen=True)
class Spec:
    """A registry name plus constructor options; ``label`` is the text it was parsed from. ``compiled``:
    time it under ``torch.compile`` (label ``<text>+compile``)."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)
    label: str = ""
    compiled: bool = False


def with_compiled(specs: list[Spec], compile: bool) -> list[Spec]:
    """``specs``, each followed by its compiled twin when ``compile``: ``flatten``, ``flatten+compile``."""
    if not compile:
        return specs
    return [s for spec in specs for s in (spec, replace(spec, label=f"{spec.label}+compile", compiled=True))]


def compile_options() -> dict[str, Any]:
    """``torch.compile`` keyword arguments of every compiled case: one graph per size, dtype and mode (the
    fixed-shape code a training run at one crop size gets). A bench compiles the same code at many sizes:
    allow that many graphs, and fail rather than time eager code under a ``+compile`` label past the limit.
    """
    import torch._dynamo

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    return {"dynamic": False}


def parse_spec(text: str) -> Spec:
    """``flatten`` or ``linear:feature_map=relu:eps=1e-4``; values are read as YAML scalars/lists. A
    ``label=<text>`` option names the spec in tables and run directories instead of its whole text."""
    name, *pairs = text.split(":")
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(
                f"spec {text!r}: option {pair!r} is not key=value (e.g. linear:feature_map=relu)"
            )
        options[key] = yaml.safe_load(value)
    if not name:
        raise ValueError(f"spec {text!r} has no name before the options")
    label = options.pop("label", text)
    return Spec(name, options, str(label))


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


def grid_for(tokens: int) -> tuple[int, int]:
    """The most square (H, W) with H·W = tokens, H ≤ W."""
    height = int(tokens**0.5)
    while tokens % height:
        height -= 1
    return height, tokens // height


def format_count(value: int) -> str:
    """Token and pixel counts as exact integers with thousands separators: 65536 -> '65,536'."""
    return f"{value:,}"
