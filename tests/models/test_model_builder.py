"""build_model from names and plain options: errors, config round trip, heads, optimizer parameter groups."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

from segattn.models import available_heads, available_models, build_model


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "resnet"}, "unknown model 'resnet'; expected one of: efficientvit, pvt, unet, vit"),
        (
            {"name": "vit", "head": "fpn"},
            "unknown head 'fpn'; expected one of: efficientvit, linear, mlp, pup, unet",
        ),
        ({"name": "vit", "depht": 2}, "model 'vit' with head 'linear' has no option 'depht'"),
        ({"name": "vit", "size": "huge"}, "vit: size='huge'; expected one of"),
        ({"name": "pvt", "size": "b9"}, "pvt: size='b9'; expected one of"),
        ({"name": "pvt", "depths": [1, 1]}, "pvt: depths=[1, 1] has 2 entries; expected one per stage"),
        ({"name": "vit", "attention": "flash"}, "unknown attention 'flash'"),
        ({"name": "pvt", "attention_options": {"sr_ratio": 2}}, "set the per-stage model.sr_ratios"),
        ({"name": "unet", "encoder": "resnet_nope"}, "unet: encoder='resnet_nope' is not a timm CNN"),
        ({"name": "efficientvit", "size": "b9"}, "efficientvit: size='b9'; expected one of"),
        ({"name": "efficientvit", "head_dim": 24}, "efficientvit: head_dim=24 does not divide"),
    ],
)
def test_clear_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as err:
        build_model(**{"num_classes": 3, **kwargs})
    assert message in str(err.value)


def test_option_error_lists_valid_options() -> None:
    with pytest.raises(ValueError) as err:
        build_model("pvt", 3, stages=4)
    for option in ("size", "embed_dims", "sr_ratios", "head", "aux_head", "pretrained", "layer_decay"):
        assert option in str(err.value)


def test_config_rebuilds_the_same_model_from_plain_values(build_tiny) -> None:
    model = build_tiny("pvt", "linformer", aux_head=True, head="pup")
    config = json.loads(json.dumps(model.config))  # plain Python types only
    assert config == model.config
    assert config["name"] == "pvt" and config["attention"] == "linformer" and config["aux_head"] is True
    rebuilt = build_model(**config)
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    assert {k: v.shape for k, v in rebuilt.state_dict().items()} == shapes
    rebuilt.load_state_dict(model.state_dict())


def test_hydra_configs_become_plain_python() -> None:
    cfg = OmegaConf.create({"name": "vit", "embed_dim": 32, "depth": 1, "num_heads": 2, "out_indices": [0]})
    model = build_model(
        **cfg, num_classes=3, attention_options=OmegaConf.create({"eps": 1e-5}), attention="linear"
    )
    assert type(model.config["out_indices"]) is list and type(model.config["attention_options"]) is dict
    assert model.encoder.blocks[0].attn.eps == 1e-5


@pytest.mark.parametrize("head", available_heads())
@pytest.mark.parametrize("name", available_models())
def test_every_head_on_every_family(build_tiny, name: str, head: str) -> None:
    model = build_tiny(name, head=head).eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, 100, 150)).shape == (1, 3, 100, 150)


def group_of(groups: list[dict], model: torch.nn.Module) -> dict[str, dict]:
    by_id = {id(p): g for g in groups for p in g["params"]}
    return {name: by_id[id(p)] for name, p in model.named_parameters()}


def test_param_groups_decay_rules_head_multiplier_and_layer_decay(build_tiny) -> None:
    model = build_tiny("vit", "flatten", aux_head=True, head_lr_mult=10.0, layer_decay=0.5)  # depth 2: L = 3
    groups = model.param_groups(lr=1e-3, weight_decay=0.05)
    params = [p for g in groups for p in g["params"]]
    assert len(params) == len({id(p) for p in params}) == len(list(model.parameters()))
    group = group_of(groups, model)
    expected = {  # name: (lr, weight decay)
        "encoder.patch_embed.proj.weight": (1e-3 * 0.5**3, 0.05),
        "encoder.pos_embed": (1e-3 * 0.5**3, 0.0),
        "encoder.blocks.0.attn.qkv.weight": (1e-3 * 0.5**2, 0.05),
        "encoder.blocks.0.attn.qkv.bias": (1e-3 * 0.5**2, 0.0),
        "encoder.blocks.0.attn.scale": (1e-3 * 0.5**2, 0.0),  # FLatten's per-channel scale
        "encoder.blocks.1.norm1.weight": (1e-3 * 0.5, 0.0),
        "encoder.blocks.1.mlp.fc2.weight": (1e-3 * 0.5, 0.05),
        "encoder.norm.weight": (1e-3, 0.0),
        "head.classifier.weight": (1e-2, 0.05),
        "head.classifier.bias": (1e-2, 0.0),
        "aux_head.conv.bn.weight": (1e-2, 0.0),
    }
    for name, (lr, decay) in expected.items():
        assert group[name]["lr"] == pytest.approx(lr), name
        assert group[name]["weight_decay"] == decay, name
    optimizer = torch.optim.AdamW(groups)
    model(torch.randn(1, 3, 32, 32)).mean().backward()
    optimizer.step()


def test_param_groups_without_layer_decay_use_base_lr(build_tiny) -> None:
    model = build_tiny("unet")
    group = group_of(model.param_groups(lr=0.1, weight_decay=0.01), model)
    assert group["encoder.model.layer1.0.conv1.weight"]["lr"] == 0.1
    assert group["encoder.model.bn1.weight"]["weight_decay"] == 0.0
    assert group["head.attn_blocks.0.attn.qkv.weight"]["lr"] == 0.1


def test_layer_ids_count_from_the_stem(build_tiny) -> None:
    pvt = build_tiny("pvt", depths=[1, 2, 1, 1]).encoder  # 5 blocks: L = 6
    assert pvt.num_layers == 6
    assert pvt.layer_id("patch_embed.proj.weight") == 0
    assert pvt.layer_id("stages.0.blocks.0.attn.qkv.weight") == 1
    assert pvt.layer_id("stages.0.norm.weight") == 1
    assert pvt.layer_id("stages.1.downsample.proj.weight") == 2
    assert pvt.layer_id("stages.1.blocks.1.mlp.fc1.weight") == 3
    assert pvt.layer_id("stages.3.norm.bias") == 5
    unet = build_tiny("unet").encoder  # resnet: stem, layer1..layer4 are its 5 feature levels
    assert unet.num_layers == 5
    assert [unet.layer_id(f"model.{n}.weight") for n in ("conv1", "bn1")] == [0, 0]
    assert [unet.layer_id(f"model.layer{i}.0.conv1.weight") for i in (1, 2, 3, 4)] == [1, 2, 3, 4]
