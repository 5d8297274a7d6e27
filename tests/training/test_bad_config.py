"""Bad configurations fail before training starts, with an error naming the key, the value and what was
expected: no W&B run, trainer, checkpoint or run directory is created."""

from __future__ import annotations

import pytest
import torch
from hydra.errors import MissingConfigException
from reliability_fixtures import BASE, UNET, VIT, compose_run

from segattn.attention import AttentionBase
from segattn.models import build_model
from segattn.training import run as train
from segattn.training.preflight import attention_grid

PVT = ["model=pvt", "model.embed_dims=[16,16,32,32]", "model.depths=[1,1,1,1]", "model.num_heads=[1,1,2,2]"]
LINFORMER = ["attention=linformer", "attention.options.proj_len=4"]
SLIDE_40 = ["inference.mode=slide", "inference.crop=[40,40]"]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            [*VIT, "attention.name=nope"],
            "unknown attention 'nope'; expected one of: agent, efficient, flatten, ",
        ),
        ([*VIT, "model.name=nope"], "unknown model 'nope'; expected one of: efficientvit, pvt, unet, vit"),
        (
            [*VIT, "data.name=nope"],
            "unknown dataset 'nope'; expected one of: ade20k, camvid, cityscapes, folder, ",
        ),
        (
            [*VIT, "data.num_classes=7"],
            "data.num_classes=7 but dataset 'synthetic' has 5 classes (background, square, dark frame, ",
        ),
        (  # ViT patch 8: a 32x32 crop is a 4x4 grid = 16 tokens
            [*VIT, *LINFORMER, "attention.options.max_tokens=15"],
            "data.crop_size=[32, 32]: at 32×32 px the first attention stage sees a 4×4 grid = 16 tokens "
            "(stride 8), more than attention.options.max_tokens=15; set attention.options.max_tokens=16",
        ),
        (  # PVT stage 1 runs at stride 4 on the input padded to a multiple of 32: 8x8 = 64 tokens
            [*PVT, *LINFORMER, "attention.options.max_tokens=63"],
            "a 8×8 grid = 64 tokens (stride 4), more than attention.options.max_tokens=63",
        ),
        (  # the UNet decoder attends at the encoder's finest level, stride 4 for a ResNet
            [*UNET, *LINFORMER, "attention.options.max_tokens=63"],
            "a 8×8 grid = 64 tokens (stride 4), more than attention.options.max_tokens=63",
        ),
        (  # training fits; whole-image validation at test-time scale 2 does not
            [*VIT, *LINFORMER, "attention.options.max_tokens=16", "inference.scales=[1.0,2.0]"],
            "inference.scales=[1.0, 2.0] on synthetic/val/000000: at 64×64 px the first attention stage "
            "sees a 8×8 grid = 64 tokens",
        ),
        (
            [*VIT, *LINFORMER, "attention.options.max_tokens=16", *SLIDE_40],
            "inference.crop=[40, 40]: at 40×40 px the first attention stage sees a 5×5 grid = 25",
        ),
    ],
)
def test_bad_config_fails_before_training(tmp_path, monkeypatch, overrides, expected):
    monkeypatch.setattr(train, "build_loggers", pytest.fail)  # no W&B run, no trainer, no checkpoint
    cfg = compose_run(tmp_path, *BASE, *overrides, "logger=wandb")
    with pytest.raises(ValueError) as error:
        train.run(cfg)
    assert expected in str(error.value)
    assert not (tmp_path / "run").exists()


def test_unknown_config_group_option_lists_the_available_ones(tmp_path):
    with pytest.raises(MissingConfigException) as error:
        compose_run(tmp_path, *BASE, "attention=nope")
    assert "Could not find 'attention/nope'" in str(error.value)
    assert all(name in str(error.value) for name in ("flatten", "linformer", "softmax"))


def test_linformer_at_exactly_its_limit_trains(tmp_path):
    cfg = compose_run(tmp_path, *BASE, *VIT, *LINFORMER, "attention.options.max_tokens=16", "debug=fdr")
    assert train.run(cfg)["steps"] == 1


@pytest.mark.parametrize(
    ("family", "options"),
    [
        ("vit", {"embed_dim": 16, "depth": 1, "num_heads": 2, "patch_size": 8, "head_channels": 8}),
        ("pvt", {"embed_dims": [8, 8, 16, 16], "depths": [1, 1, 1, 1], "num_heads": [1, 1, 1, 1]}),
        ("unet", {"encoder": "test_resnet", "head_channels": 16}),
        ("efficientvit", {"size": "b0"}),  # attention in the stride-16 and -32 stages only
    ],
)
def test_attention_grid_is_the_largest_grid_the_model_attends_over(family, options):
    """The preflight's arithmetic against what a real forward pass feeds the attention layers."""
    model = build_model(family, num_classes=3, attention="linear", **options).eval()
    seen = []
    for module in model.modules():
        if isinstance(module, AttentionBase):
            module.register_forward_pre_hook(lambda _, args: seen.append(tuple(args[1])))
    with torch.no_grad():
        model(torch.zeros(1, 3, 37, 70))
    assert max(seen, key=lambda hw: hw[0] * hw[1]) == attention_grid(model, (37, 70))
