"""The attention zoo: a functional core (pure math on [B, heads, N, d]) and thin modules around it."""

from .base import AttentionBase
from .functional import (
    efficient_attention,
    focused_feature_map,
    focused_linear_attention,
    kernel_attention,
    linear_attention,
    softmax_attention,
    taylor_attention,
)
from .functional_agent import adaptive_pooling_matrix, agent_attention, agent_tokens, pola_attention
from .functional_approx import (
    iterative_pinv,
    linformer_attention,
    nystrom_attention,
    orthogonal_random_features,
    performer_attention,
    positive_random_features,
    segment_means,
)
from .functional_lite import lite_linear_attention
from .registry import (
    ATTENTION_REGISTRY,
    attention_class,
    attention_options,
    available_attention,
    build_attention,
    check_band_variant,
)

__all__ = [
    "ATTENTION_REGISTRY",
    "AttentionBase",
    "adaptive_pooling_matrix",
    "agent_attention",
    "agent_tokens",
    "attention_class",
    "attention_options",
    "available_attention",
    "build_attention",
    "check_band_variant",
    "efficient_attention",
    "focused_feature_map",
    "focused_linear_attention",
    "iterative_pinv",
    "kernel_attention",
    "linear_attention",
    "linformer_attention",
    "lite_linear_attention",
    "nystrom_attention",
    "orthogonal_random_features",
    "performer_attention",
    "pola_attention",
    "positive_random_features",
    "segment_means",
    "softmax_attention",
    "taylor_attention",
]
