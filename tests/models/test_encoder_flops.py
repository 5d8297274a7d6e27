"""FLOP scaling with FlopCounterMode: linear attention keeps the encoder linear in pixels, softmax does not.

Shapes only matter, so the forward runs under FakeTensorMode (no arithmetic) with SDPA forced onto its
math backend, whose matmuls FlopCounterMode counts (the fused CPU kernel is not counted).
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from segattn.attention import attention_class, attention_options, available_attention
from segattn.models.blocks import AttentionSpec
from segattn.models.pvt import create_pvt

SIZE, DOUBLE = (512, 512), (1024, 512)  # stage 1 (stride 4): 16384 → 32768 tokens
LINEAR_VARIANTS = [name for name in available_attention() if not attention_class(name).quadratic]
STAGE1_ATTN = "PyramidVisionTransformer.stages.0.blocks.0.attn"


def pvt_b0_widths(attention: str, **options) -> torch.nn.Module:
    """PVT-b0 widths with one block per stage (FLOP ratios do not depend on depth)."""
    accepted = attention_options(attention)
    attn_options = {"max_tokens": DOUBLE[0] * DOUBLE[1] // 16} if "max_tokens" in accepted else {}
    return create_pvt(
        AttentionSpec(attention, attn_options), size="b0", depths=[1, 1, 1, 1], **options
    ).eval()


def forward_flops(encoder: torch.nn.Module, hw: tuple[int, int]) -> dict[str, int]:
    """FLOPs per module name ("Global" = whole forward) of one forward of a [1, 3, H, W] image."""
    with (
        FakeTensorMode(allow_non_fake_inputs=True),
        torch.no_grad(),
        sdpa_kernel(SDPBackend.MATH),
        FlopCounterMode(display=False) as counter,
    ):
        encoder(torch.empty(1, 3, *hw))
    return {name: sum(ops.values()) for name, ops in counter.get_flop_counts().items()}


@pytest.mark.parametrize("attention", LINEAR_VARIANTS)
def test_linear_variants_double_encoder_flops_when_area_doubles(attention: str) -> None:
    encoder = pvt_b0_widths(attention)
    ratio = forward_flops(encoder, DOUBLE)["Global"] / forward_flops(encoder, SIZE)["Global"]
    assert 1.8 <= ratio <= 2.3, f"{attention}: encoder FLOPs ×{ratio:.3f} for ×2 pixels"


def test_softmax_attention_quadruples_at_stage1_token_count() -> None:
    """Stage-1 attention without spatial reduction: 8NC² (qkv, proj) + 4N²C (QKᵀ, AV) FLOPs, C = 32."""
    encoder = pvt_b0_widths("softmax", sr_ratios=[1, 1, 1, 1])
    small, large = forward_flops(encoder, SIZE), forward_flops(encoder, DOUBLE)
    channels = 32
    for hw, counts in ((SIZE, small), (DOUBLE, large)):
        tokens = hw[0] // 4 * hw[1] // 4
        assert counts[STAGE1_ATTN] == 8 * tokens * channels**2 + 4 * tokens**2 * channels
    ratio = large[STAGE1_ATTN] / small[STAGE1_ATTN]
    assert 3.9 <= ratio <= 4.0, f"stage-1 softmax attention FLOPs ×{ratio:.3f} for ×2 tokens"
    assert large["Global"] / small["Global"] > 3.5  # the whole encoder is dominated by it
