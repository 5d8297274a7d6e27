"""Hugging Face SegFormer / MiT checkpoints load into model=pvt and give transformers' logits.

transformers builds the reference (random weights, ``save_pretrained``); segattn reads the folder with no
transformers import of its own.
"""

from __future__ import annotations

import json
from pathlib import Path

import huggingface_hub
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import SegformerConfig, SegformerForSemanticSegmentation, SegformerModel

import segattn
from segattn.images import IMAGENET_MEAN, IMAGENET_STD
from segattn.models import build_model

TINY = {
    "hidden_sizes": [8, 16, 24, 32],
    "depths": [1, 2, 1, 1],
    "num_attention_heads": [1, 2, 3, 4],
    "decoder_hidden_size": 16,
    "num_labels": 5,
}
PVT_TINY = {"embed_dims": [8, 16, 24, 32], "depths": [1, 2, 1, 1], "num_heads": [1, 2, 3, 4]}


def randomised(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """``model`` in eval mode with every parameter and BatchNorm statistic drawn at random (not the near-zero
    init), so that logits compared within 1e-4 say something."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(0.3 * torch.randn(parameter.shape, generator=generator))
        for name, buffer in model.named_buffers():
            if name.endswith(("running_mean", "running_var")):
                buffer.copy_(torch.rand(buffer.shape, generator=generator) + 0.5)
    return model.eval()


@pytest.fixture(scope="module")
def segformer(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, SegformerForSemanticSegmentation]:
    """A tiny SegFormer segmentation model saved by transformers, and the model."""
    config = SegformerConfig(**TINY, id2label={i: f"class{i}" for i in range(5)})
    model = randomised(SegformerForSemanticSegmentation(config), seed=0)
    folder = tmp_path_factory.mktemp("segformer")
    model.save_pretrained(folder)
    return folder, model


@pytest.fixture(scope="module")
def mit(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, SegformerModel]:
    """A tiny MiT encoder (SegformerModel, no decode head) saved by transformers, and the model."""
    model = randomised(SegformerModel(SegformerConfig(**TINY)), seed=1)
    folder = tmp_path_factory.mktemp("mit")
    model.save_pretrained(folder)
    return folder, model


def test_segformer_folder_gives_transformers_logits(segformer) -> None:
    folder, reference = segformer
    model = build_model("pvt", 5, pretrained=str(folder)).eval()
    images = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        expected = reference(pixel_values=images).logits  # [B, 5, H/4, W/4]
        torch.testing.assert_close(model.head(model.encoder(images)), expected, atol=1e-4, rtol=0)
        upsampled = F.interpolate(expected, size=(64, 96), mode="bilinear", align_corners=False)
        torch.testing.assert_close(model(images), upsampled, atol=1e-4, rtol=0)
    assert model.config["head_channels"] == 16 and model.config["mlp_ratios"] == [4, 4, 4, 4]


def test_mit_encoder_gives_transformers_features(mit) -> None:
    folder, reference = mit
    model = build_model("pvt", 3, pretrained=str(folder)).eval()
    images = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        expected = reference(pixel_values=images, output_hidden_states=True).hidden_states
        for ours, theirs in zip(model.encoder(images), expected, strict=True):
            torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)


def test_recorded_config_rebuilds_the_segformer_architecture(segformer) -> None:
    folder, _ = segformer
    model = build_model("pvt", 5, pretrained=str(folder))
    rebuilt = build_model(**{**model.config, "pretrained": None})
    rebuilt.load_state_dict(model.state_dict())  # strict: same names and shapes


@pytest.mark.parametrize("attention", ["linear", "flatten"])
def test_another_attention_fine_tunes_from_segformer_weights(segformer, attention: str) -> None:
    """The shared qkv/proj and everything outside attention load; the variant's own parameters and PVT's
    spatial reduction (which these variants do not have) do not."""
    folder, reference = segformer
    model = build_model("pvt", 5, attention=attention, pretrained=str(folder))
    block, theirs = model.encoder.stages[1].blocks[0], reference.segformer.stages[1].blocks[0]
    expected_qkv = torch.cat([theirs.attention.q_proj.weight, theirs.attention.k_proj.weight])
    torch.testing.assert_close(block.attn.qkv.weight[:32], expected_qkv)
    torch.testing.assert_close(block.attn.proj.weight, theirs.attention.o_proj.weight)
    torch.testing.assert_close(block.mlp.fc1.weight, theirs.mlp.fc1.weight)
    assert not hasattr(block.attn, "sr")
    if attention == "flatten":
        assert torch.equal(block.attn.scale, torch.zeros_like(block.attn.scale))  # FLatten's own init
    torch.testing.assert_close(model.head.classifier.weight, reference.decode_head.classifier.weight)


def test_classifier_for_other_classes_keeps_its_initialisation(segformer) -> None:
    folder, reference = segformer
    with pytest.warns(UserWarning, match="predicts 5 classes, this model 3: .* the classifier"):
        model = build_model("pvt", 3, pretrained=str(folder))
    assert model.head.classifier.weight.shape[0] == 3
    torch.testing.assert_close(model.head.fuse.bn.running_var, reference.decode_head.batch_norm.running_var)


def test_hub_id_loads_from_the_local_hf_cache_only(
    segformer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, reference = segformer
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="nor a Hugging Face model of that id in the local cache"):
        build_model("pvt", 5, pretrained="nvidia/segformer-tiny")
    repo = tmp_path / "models--nvidia--segformer-tiny"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0123abcd")
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        (snapshot / name).write_bytes((folder / name).read_bytes())
    model = build_model("pvt", 5, pretrained="nvidia/segformer-tiny")
    torch.testing.assert_close(model.head.classifier.bias, reference.decode_head.classifier.bias)


def test_open_model_predicts_with_a_segformer_folder(segformer) -> None:
    folder, reference = segformer
    opened = segattn.open_model(folder)
    assert opened.record.classes == [f"class{i}" for i in range(5)] and opened.format == "segformer"
    rgb = np.random.default_rng(0).integers(0, 256, (64, 96, 3), dtype=np.uint8)
    normalised = (rgb / 255.0 - np.array(IMAGENET_MEAN)) / np.array(IMAGENET_STD)
    images = torch.from_numpy(normalised.transpose(2, 0, 1)[None]).float()
    with torch.no_grad():
        logits = reference(pixel_values=images).logits
    expected = F.interpolate(logits, size=(64, 96), mode="bilinear", align_corners=False)[0]
    np.testing.assert_allclose(opened.logits(rgb), expected.numpy(), atol=1e-4, rtol=0)


def test_a_folder_that_is_not_a_segformer_says_what_it_is(tmp_path: Path) -> None:
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    with pytest.raises(ValueError, match=r"a Hugging Face bert model \(BertModel\), not a SegFormer") as err:
        build_model("pvt", 3, pretrained=str(bert))
    images = tmp_path / "images"
    images.mkdir()
    (images / "a.png").write_bytes(b"")
    with pytest.raises(ValueError, match=r"a folder without config.json \(it holds a.png\)") as err2:
        build_model("pvt", 3, pretrained=str(images))
    assert "\n" not in str(err.value) + str(err2.value)
    for record in ("segattn.json", "model.yaml"):  # an export, and one written before segattn.json
        export = tmp_path / record.replace(".", "_")
        export.mkdir()
        (export / record).write_text("{}")
        with pytest.raises(ValueError, match=rf"a segattn export \({record}\), not a SegFormer: open it"):
            build_model("pvt", 3, pretrained=str(export))


def test_segformer_sets_the_architecture_and_refuses_another(segformer) -> None:
    folder, _ = segformer
    with pytest.raises(ValueError, match=r"model.embed_dims=\[16, 32, 32, 64\] \(the SegFormer's"):
        build_model("pvt", 5, pretrained=str(folder), embed_dims=[16, 32, 32, 64])
    with pytest.raises(ValueError, match="a SegFormer loads into model=pvt, not model=vit"):
        build_model("vit", 5, pretrained=str(folder))
    model = build_model("pvt", 5, pretrained=str(folder), **PVT_TINY)  # lists that agree are accepted
    assert model.config["embed_dims"] == PVT_TINY["embed_dims"]
