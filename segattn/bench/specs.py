"""Command-line specs: ``name:key=value:key=value`` for variants and models, ``64k`` for token counts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml


@dataclass(frozen=True)
class Spec:
    """A registry name plus constructor options; ``label`` is the text it was parsed from."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)
    label: str = ""


def parse_spec(text: str) -> Spec:
    """``flatten`` or ``linear:feature_map=relu:eps=1e-4``; values are read as YAML scalars/lists."""
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
    return Spec(name, options, text)


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
