"""FLOP scaling with FlopCounterMode: linear attention keeps the encoder linear in pixels, softmax does not.

SDPA runs on its math backend, whose matmuls FlopCounterMode counts (it does not count the fused CPU
kernel). The encoders really run (on CPU), at PVT-b0 widths with one block per stage.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from segattn.attention import attention_class, attention_options, available_attention
from segattn.models.blocks import AttentionSpec
from segattn.models.pvt import create_pvt

LINEAR_VARIANTS = [name for name in available_attention() if not attention_class(name).quadratic]
STAGE1_ATTN = "PyramidVisionTransformer.stages.0.blocks.0.attn"


def pvt_b0_widths(attention: str, **options) -> torch.nn.Module:
    """PVT-b0 widths with one block per stage (FLOP ratios do not depend on depth)."""
    attn_options = {"max_tokens": 128 * 128} if "max_tokens" in attention_options(attention) else {}
    return create_pvt(
        AttentionSpec(attention, attn_options), size="b0", depths=[1, 1, 1, 1], **options
    ).eval()


def forward_flops(encoder: torch.nn.Module, hw: tuple[int, int]) -> dict[str, int]:
    """FLOPs per module name ("Global" = whole forward) of one forward of a [1, 3, H, W] image."""
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        encoder(torch.randn(1, 3, *hw))
    return {name: sum(ops.values()) for name, ops in counter.get_flop_counts().items()}


@pytest.mark.parametrize("attention", LINEAR_VARIANTS)
def test_linear_variants_double_encoder_flops_when_area_doubles(attention: str) -> None:
    """256×512 → 512×512 pixels: 8192 → 16384 tokens at stage 1."""
    encoder = pvt_b0_widths(attention)
    ratio = forward_flops(encoder, (512, 512))["Global"] / forward_flops(encoder, (256, 512))["Global"]
    assert 1.8 <= ratio <= 2.3, f"{attention}: encoder FLOPs ×{ratio:.3f} for ×2 pixels"


def test_softmax_attention_quadruples_at_stage1_token_count() -> None:
    """Stage-1 attention without spatial reduction costs 8NC² (qkv, proj) + 4N²C (QKᵀ, AV) FLOPs with
    C = 32; from 128×128 to 256×128 pixels N goes 1024 → 2048 and the cost ×3.88 (→ 4 as N ≫ C)."""
    encoder = pvt_b0_widths("softmax", sr_ratios=[1, 1, 1, 1])
    small, large = forward_flops(encoder, (128, 128)), forward_flops(encoder, (256, 128))
    channels = 32
    for tokens, counts in ((1024, small), (2048, large)):
        assert counts[STAGE1_ATTN] == 8 * tokens * channels**2 + 4 * tokens**2 * channels
    assert large[STAGE1_ATTN] / small[STAGE1_ATTN] >= 3.85
    assert large["Global"] / small["Global"] > 2.3  # the whole encoder leaves the linear band too
