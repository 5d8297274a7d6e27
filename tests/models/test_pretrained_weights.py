"""Pretrained encoder weights from local files and from the local Hugging Face cache; never the network."""

from __future__ import annotations

from pathlib import Path

import huggingface_hub
import pytest
import timm
import torch
from safetensors.torch import save_file
from timm.models.pvt_v2 import PyramidVisionTransformerV2

from segattn.models import build_model

TINY_PVT = {
    "embed_dims": [16, 32, 32, 64],
    "depths": [1, 1, 1, 1],
    "num_heads": [1, 1, 2, 2],
    "mlp_ratios": [2] * 4,
}


def timm_tiny_pvt() -> PyramidVisionTransformerV2:
    """A timm pvt_v2 with the tiny widths (timm format: attn.q + attn.kv, ImageNet head)."""
    torch.manual_seed(1)
    return PyramidVisionTransformerV2(
        embed_dims=(16, 32, 32, 64), depths=(1, 1, 1, 1), num_heads=(1, 1, 2, 2), mlp_ratios=(2, 2, 2, 2)
    ).eval()


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("tried to download")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", refuse)
    monkeypatch.setattr(timm.models._hub, "hf_hub_download", refuse, raising=False)


def test_timm_format_safetensors_file_reproduces_timm_features(tmp_path: Path, no_network) -> None:
    reference = timm_tiny_pvt()
    path = tmp_path / "pvt_tiny.safetensors"
    save_file({k: v.contiguous() for k, v in reference.state_dict().items()}, path)
    model = build_model("pvt", 3, pretrained=str(path), **TINY_PVT).eval()
    images = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        expected = reference.forward_intermediates(images, intermediates_only=True)
        for ours, theirs in zip(model.encoder(images), expected, strict=True):
            torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_pth_checkpoint_wrapper_loads_with_weights_only(tmp_path: Path) -> None:
    reference = timm_tiny_pvt()
    path = tmp_path / "pvt_tiny.pth"
    torch.save({"state_dict": reference.state_dict(), "epoch": 3}, path)
    model = build_model("pvt", 3, pretrained=str(path), **TINY_PVT)
    q, kv = reference.stages[2].blocks[0].attn.q, reference.stages[2].blocks[0].attn.kv
    torch.testing.assert_close(model.encoder.stages[2].blocks[0].attn.qkv.bias, torch.cat([q.bias, kv.bias]))


def test_softmax_weights_load_into_another_attention_variant(tmp_path: Path) -> None:
    """qkv/proj and everything outside attention load; PVT's sr/norm are dropped, FLatten's extras stay."""
    reference = timm_tiny_pvt()
    path = tmp_path / "pvt_tiny.safetensors"
    save_file({k: v.contiguous() for k, v in reference.state_dict().items()}, path)
    model = build_model("pvt", 3, attention="flatten", pretrained=str(path), **TINY_PVT)
    attn = model.encoder.stages[0].blocks[0].attn
    torch.testing.assert_close(attn.proj.weight, reference.stages[0].blocks[0].attn.proj.weight)
    assert torch.equal(attn.scale, torch.zeros_like(attn.scale))  # FLatten's own init
    assert not hasattr(attn, "sr")


def test_own_encoder_weights_round_trip(tmp_path: Path, build_tiny) -> None:
    source = build_tiny("vit", "taylor")
    path = tmp_path / "encoder.safetensors"
    save_file({k: v.contiguous() for k, v in source.encoder.state_dict().items()}, path)
    loaded = build_tiny("vit", "taylor", pretrained=str(path))
    for key, value in source.encoder.state_dict().items():
        assert torch.equal(loaded.encoder.state_dict()[key], value), key
    assert loaded.config["pretrained"] == str(path)


def test_missing_file_says_how_to_provide_weights(tmp_path: Path) -> None:
    path = tmp_path / "nowhere" / "pvt_v2_b0.pth"
    with pytest.raises(FileNotFoundError) as err:
        build_model("pvt", 3, pretrained=str(path), **TINY_PVT)
    message = str(err.value)
    assert str(path) in message and "model.pretrained" in message and "Hugging Face cache" in message


def test_wrong_architecture_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "vit.safetensors"
    vit = build_model("vit", 3, embed_dim=32, depth=1, num_heads=2)
    save_file({k: v.contiguous() for k, v in vit.encoder.state_dict().items()}, path)
    with pytest.raises(ValueError, match="does not fit the PyramidVisionTransformer encoder: missing"):
        build_model("pvt", 3, pretrained=str(path), **TINY_PVT)


def test_unknown_timm_name() -> None:
    with pytest.raises(ValueError, match="neither an existing weights file"):
        build_model("unet", 3, encoder="test_resnet", pretrained="no_such_model_xyz")


def test_timm_name_missing_from_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_network) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(FileNotFoundError) as err:
        build_model("unet", 3, encoder="test_resnet", pretrained="test_resnet.r160_in1k")
    assert "not in the local Hugging Face cache" in str(err.value)
    assert "timm.create_model('test_resnet.r160_in1k', pretrained=True)" in str(err.value)


def test_timm_name_loads_from_local_hf_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_network
) -> None:
    """A cache laid out like huggingface_hub's (refs/main → snapshot) for timm/test_resnet.r160_in1k."""
    torch.manual_seed(2)
    classifier = timm.create_model("test_resnet", pretrained=False)
    repo = tmp_path / "models--timm--test_resnet.r160_in1k"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0123abcd")
    (repo / "snapshots" / "0123abcd").mkdir(parents=True)
    save_file(classifier.state_dict(), repo / "snapshots" / "0123abcd" / "model.safetensors")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    model = build_model("unet", 3, encoder="test_resnet", pretrained="test_resnet.r160_in1k")
    encoder = model.encoder.model
    assert torch.equal(encoder.layer3[0].conv2.weight, classifier.layer3[0].conv2.weight)
    assert torch.equal(encoder.bn1.running_var, classifier.bn1.running_var)
