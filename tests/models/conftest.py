"""Tiny model configurations shared by the model tests (a few blocks of width 16-64 keep CPU tests fast)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from segattn.attention import attention_options
from segattn.models import MODEL_FAMILIES, Segmentor, build_model

TINY_FAMILY_OPTIONS = {  # no stochastic depth: a model in training mode computes the same twice
    "vit": {"embed_dim": 32, "depth": 2, "num_heads": 2, "head_channels": 16, "drop_path_rate": 0.0},
    "pvt": {
        "embed_dims": [16, 32, 32, 64],
        "depths": [1, 1, 1, 1],
        "num_heads": [1, 1, 2, 2],
        "head_channels": 16,
        "drop_path_rate": 0.0,
    },
    "unet": {"encoder": "test_resnet", "head_channels": 32},
    "efficientvit": {"widths": [8, 8, 16, 16, 32], "depths": [1, 1, 1, 1, 1], "head_channels": 16},
}
# Linformer's learned sequence projections must cover the largest grid (128×160 padded input at stride 4
# = 1280 tokens); short projections, few landmarks / random features keep the approximations cheap (16
# landmarks also exercise Nyström with fewer tokens than landmarks on PVT's last stage).
TINY_ATTENTION_OPTIONS = {"max_tokens": 2048, "proj_len": 16, "num_landmarks": 16, "num_features": 32}


@pytest.fixture
def tiny_family_options() -> dict[str, dict]:
    """``TINY_FAMILY_OPTIONS``, for tests that merge them into other options (a conftest is not importable
    by name: each test folder has one)."""
    return TINY_FAMILY_OPTIONS


@pytest.fixture
def build_tiny() -> Callable[..., Segmentor]:
    """``build_tiny(family, attention, **overrides)`` → a tiny Segmentor with 3 classes."""

    def build(name: str, attention: str = "softmax", **overrides) -> Segmentor:
        accepted = attention_options(attention)
        options = {k: v for k, v in TINY_ATTENTION_OPTIONS.items() if k in accepted}
        family = {**TINY_FAMILY_OPTIONS[name], **overrides}
        head = family.get("head") or MODEL_FAMILIES[name].default_head
        if head == "linear" and not family.get("aux_head") and "head_channels" not in overrides:
            del family["head_channels"]  # nothing has that width: build_model would warn that it is unused
        return build_model(name, num_classes=3, attention=attention, attention_options=options, **family)

    return build
