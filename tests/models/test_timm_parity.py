"""With softmax attention and timm weights copied over, our encoders compute exactly timm's features."""

from __future__ import annotations

import pytest
import timm
import torch

from segattn.models.blocks import AttentionSpec
from segattn.models.pvt import create_pvt
from segattn.models.vit import create_vit

SOFTMAX = AttentionSpec("softmax")


def num_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("hw", [(224, 224), (96, 160)])
def test_vit_features_equal_timm_forward_features(hw: tuple[int, int]) -> None:
    """timm ViT-Ti/16 (4 of its 12 blocks) without cls token and with dynamic image size, so its position
    embedding is resampled to the 6×10 grid of a 96×160 image as ours is."""
    torch.manual_seed(0)
    reference = timm.create_model(
        "vit_tiny_patch16_224",
        pretrained=False,
        depth=4,
        class_token=False,
        global_pool="avg",
        fc_norm=False,
        dynamic_img_size=True,
    )
    ours = create_vit(SOFTMAX, size="tiny", depth=4, out_indices=[-1])
    ours.load_state_dict(ours.convert_state_dict(reference.state_dict()))  # strict
    reference, ours = reference.double().eval(), ours.double().eval()
    images = torch.randn(1, 3, *hw, dtype=torch.float64)
    with torch.no_grad():
        expected = reference.forward_features(images)  # [B, N, C] after the final norm
        tokens, grid = ours.forward_tokens(images)
    assert grid == (hw[0] // 16, hw[1] // 16)
    torch.testing.assert_close(tokens[-1], expected, rtol=0, atol=1e-5)


def test_vit_loads_a_cls_token_checkpoint_without_its_prefix() -> None:
    """timm/DeiT checkpoints carry a cls token and its position slot; both are dropped, the grid part kept."""
    reference = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=2)
    ours = create_vit(SOFTMAX, size="tiny", depth=2)
    ours.load_state_dict(ours.convert_state_dict(reference.state_dict()))  # strict
    torch.testing.assert_close(ours.pos_embed, reference.pos_embed[:, 1:], rtol=0, atol=0)
    torch.testing.assert_close(
        ours.blocks[1].attn.qkv.weight, reference.blocks[1].attn.qkv.weight, rtol=0, atol=0
    )


def test_pvt_weights_without_an_attention_kv_are_one_line_naming_the_key() -> None:
    state = timm.create_model("pvt_v2_b0", pretrained=False).state_dict()
    del state["stages.1.blocks.0.attn.kv.weight"]
    with pytest.raises(
        ValueError,
        match=r"model.pretrained: the weights hold stages.1.blocks.0.attn.q.weight "
        r"but not stages.1.blocks.0.attn.kv.weight",
    ):
        create_pvt(SOFTMAX, size="b0").convert_state_dict(state)


@pytest.mark.parametrize("hw", [(96, 160), (100, 150)])
def test_pvt_stage_outputs_equal_timm_pvt_v2_b0(hw: tuple[int, int]) -> None:
    torch.manual_seed(0)
    reference = timm.create_model("pvt_v2_b0", pretrained=False)
    ours = create_pvt(SOFTMAX, size="b0")
    ours.load_state_dict(ours.convert_state_dict(reference.state_dict()))  # strict: q+kv → qkv, no head
    first = reference.stages[0].blocks[0].attn
    torch.testing.assert_close(ours.stages[0].blocks[0].attn.qkv.weight[:32], first.q.weight, rtol=0, atol=0)
    torch.testing.assert_close(ours.stages[0].blocks[0].attn.qkv.weight[32:], first.kv.weight, rtol=0, atol=0)
    reference, ours = reference.eval(), ours.eval()
    images = torch.randn(2, 3, *hw)
    with torch.no_grad():
        expected = reference.forward_intermediates(images, intermediates_only=True)
        features = ours(images)
    assert len(features) == len(expected) == 4
    # float32 (float64 convs are slow on CPU): one fused qkv GEMM vs timm's q and kv GEMMs round differently,
    # measured max |Δ| ≈ 6e-6 on stage outputs of magnitude ≈ 4
    for ours_stage, timm_stage in zip(features, expected, strict=True):
        torch.testing.assert_close(ours_stage, timm_stage, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("size", ["b0", "b1", "b2"])
def test_pvt_param_counts_match_timm(size: str) -> None:
    """Encoder parameters vs timm pvt_v2 without its ImageNet classifier (num_classes=0): within 1%."""
    with torch.device("meta"):  # counting needs shapes only
        ours = num_params(create_pvt(SOFTMAX, size=size))
        reference = num_params(timm.create_model(f"pvt_v2_{size}", pretrained=False, num_classes=0))
    assert abs(ours - reference) <= 0.01 * reference, (size, ours, reference)
