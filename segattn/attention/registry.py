"""Attention names → module classes, and the one builder that turns a name into a module."""

from __future__ import annotations

import inspect
from typing import Any

from torch import nn

from .agent import AgentAttention
from .base import AttentionBase
from .efficient import EfficientAttention
from .flatten import FocusedLinearAttention
from .linear import LinearAttention
from .linformer import LinformerAttention
from .litemla import LiteMultiScaleAttention
from .nystrom import NystromAttention
from .performer import PerformerAttention
from .pola import PolaAttention
from .softmax import SoftmaxAttention
from .sra import SpatialReductionAttention
from .taylor import TaylorAttention

ATTENTION_REGISTRY: dict[str, type[AttentionBase]] = {
    "softmax": SoftmaxAttention,
    "efficient": EfficientAttention,
    "linear": LinearAttention,
    "taylor": TaylorAttention,
    "flatten": FocusedLinearAttention,
    "performer": PerformerAttention,
    "linformer": LinformerAttention,
    "nystrom": NystromAttention,
    "sra": SpatialReductionAttention,
    "litemla": LiteMultiScaleAttention,
    "agent": AgentAttention,
    "pola": PolaAttention,
}


def available_attention() -> list[str]:
    """Names accepted by ``build_attention`` (and by ``attention=<name>`` on the command line)."""
    return sorted(ATTENTION_REGISTRY)


def attention_class(name: str) -> type[AttentionBase]:
    """The module class registered under ``name``; a ValueError lists the valid names otherwise."""
    try:
        return ATTENTION_REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown attention {name!r}; expected one of: {', '.join(available_attention())}"
        ) from None


def attention_options(name: str) -> list[str]:
    """Constructor options of a variant beyond (dim, num_heads)."""
    params = inspect.signature(attention_class(name).__init__).parameters
    return [p for p in params if p not in ("self", "dim", "num_heads")]


def build_attention(name: str, dim: int, num_heads: int, **options: Any) -> AttentionBase:
    """Build the attention module ``name`` for width ``dim`` split into ``num_heads`` heads."""
    cls = attention_class(name)
    allowed = attention_options(name)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(
            f"attention {name!r} has no option(s) {unknown}; its options are: {', '.join(allowed)}"
        )
    return cls(dim, num_heads, **options)


def check_band_variant(model: nn.Module) -> None:
    """Refuse, naming it, an attention module without a band form (``band_parallel`` False) before a model
    is split into bands (``trainer=spatial``): softmax, sra, nystrom and linformer need all tokens at once;
    agent, pola and litemla are not split yet."""
    names = {cls: name for name, cls in ATTENTION_REGISTRY.items()}  # as the user wrote it: attention=...
    refused = sorted(
        {
            names.get(type(m), type(m).__name__)
            for m in model.modules()
            if getattr(type(m), "band_parallel", True) is False
        }
    )
    if refused:
        raise ValueError(
            f"attention={', '.join(refused)} cannot be split into bands (it needs all tokens of the image at "
            "once, or has no band form yet); use attention=efficient, linear, taylor, flatten or performer "
            "with trainer=spatial"
        )
