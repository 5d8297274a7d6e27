"""build_model's option schema (segattn/models/options.py): what is refused, what is accepted, and that
every conf/model/*.yaml composes, builds with every head, and rebuilds from its saved config."""

from __future__ import annotations

import warnings
from dataclasses import MISSING, fields
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from segattn.models import (
    HEADS,
    MODEL_FAMILIES,
    available_heads,
    available_models,
    build_model,
    model_options,
)
from segattn.models.heads import EfficientViTHead, LinearHead, MLPHead, PUPHead
from segattn.models.options import CommonOptions
from segattn.models.unet import UNetDecoder

CONF = Path(__file__).resolve().parents[2] / "conf"
HEAD_CLASSES = {
    "linear": LinearHead,
    "pup": PUPHead,
    "mlp": MLPHead,
    "unet": UNetDecoder,
    "efficientvit": EfficientViTHead,
}
FAMILY_HEADS = [(name, head) for name in available_models() for head in available_heads()]


def composed(name: str, *overrides: str) -> dict:
    """``build_model`` kwargs as train.py makes them from ``model=<name> <overrides>`` (``compile`` is a
    training option it takes out first), with the default attention group."""
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=[f"model={name}", *overrides])
    options = OmegaConf.to_container(cfg.model, resolve=True)
    options.pop("compile")
    attention = OmegaConf.to_container(cfg.attention, resolve=True)
    return {
        **options,
        "num_classes": 3,
        "attention": attention["name"],
        "attention_options": attention["options"],
    }


@pytest.mark.parametrize("name", available_models())
def test_unknown_option_is_refused_with_its_name(name: str) -> None:
    head = MODEL_FAMILIES[name].default_head
    with pytest.raises(ValueError) as err:
        build_model(name, 3, foo=1)
    message = str(err.value)
    assert message.startswith(f"model.foo=1: model {name!r} with head {head!r} has no option 'foo'; ")
    assert message.endswith(f"its options are: {', '.join(model_options(name))}")


@pytest.mark.parametrize("name", available_models())
def test_unknown_option_is_refused_even_as_none(name: str) -> None:
    with pytest.raises(ValueError, match="has no option 'foo'"):
        build_model(name, 3, foo=None)


@pytest.mark.parametrize(
    ("name", "option", "owner"),
    [
        ("vit", "encoder", "model 'unet'"),
        ("pvt", "embed_dim", "model 'vit'"),
        ("unet", "mlp_ratios", "model 'pvt'"),
    ],
)
def test_another_familys_option_is_refused_naming_its_family(name: str, option: str, owner: str) -> None:
    with pytest.raises(ValueError) as err:
        build_model(name, 3, **{option: None})
    assert f"has no option {option!r} (an option of {owner}" in str(err.value)


def test_several_refused_options_are_named_together() -> None:
    with pytest.raises(ValueError) as err:
        build_model("unet", 3, encoder="test_resnet", head="pup", foo=1, depht=2)
    assert "model.foo=1, model.depht=2: model 'unet' with head 'pup' has no options 'foo', 'depht';" in str(
        err.value
    )


@pytest.mark.parametrize("name", available_models())
@pytest.mark.parametrize("head", ["linear", "pup", "mlp"])
def test_unet_head_option_on_another_head_is_refused(build_tiny, name: str, head: str) -> None:
    """head_mlp_ratio belongs to the unet head only: a value the chosen head would ignore is an error."""
    with pytest.raises(ValueError) as err:
        build_tiny(name, head=head, head_mlp_ratio=4.0)
    message = str(err.value)
    assert (
        f"model.head_mlp_ratio=4.0: model {name!r} with head {head!r} has no option 'head_mlp_ratio'"
        in message
    )
    assert "(an option of head 'unet')" in message


@pytest.mark.parametrize("value", [None, 2.0])
def test_unet_head_option_at_none_or_its_default_is_accepted_by_any_head(build_tiny, value) -> None:
    """A config may list a head's options whatever the head (as the yaml files do with nulls)."""
    model = build_tiny("pvt", head="mlp", head_mlp_ratio=value)
    assert model.config["head_mlp_ratio"] == value
    assert build_model(**model.config).config == model.config


def test_unet_head_option_reaches_the_unet_head(build_tiny) -> None:
    ffn = build_tiny("pvt", head="unet", head_mlp_ratio=4.0).head.attn_blocks[0].mlp
    assert ffn.fc1.out_features == 4 * ffn.fc1.in_features
    default = build_tiny("pvt", head="unet", head_mlp_ratio=None).head.attn_blocks[0].mlp  # None: default
    assert default.fc1.out_features == 2 * default.fc1.in_features


@pytest.mark.parametrize(("name", "head"), FAMILY_HEADS)
def test_schemas_declare_each_option_once(name: str, head: str) -> None:
    family = [f.name for f in fields(MODEL_FAMILIES[name].options)]
    head_options = [f.name for f in fields(HEADS[head].options)]
    common = [f.name for f in fields(CommonOptions)]
    names = model_options(name, head)
    assert names == [*family, *head_options, *common]
    assert len(set(names)) == len(names)
    assert all(f.default is not MISSING for f in fields(HEADS[head].options))  # None / left out = default


def test_common_options_unused_by_the_model_warn_but_build() -> None:
    """Accepted (saved configs and tests set them for every head), but not silently."""
    with pytest.warns(
        UserWarning, match=r"model.head_channels=16 has no effect: model 'vit' with head 'linear'"
    ):
        build_model("vit", 3, depth=1, head_channels=16)
    with pytest.warns(UserWarning, match=r"attention='flatten' has no effect: model 'unet' with head 'mlp'"):
        build_model("unet", 3, encoder="test_resnet", head="mlp", attention="flatten")
    with pytest.warns(UserWarning, match=r"model.aux_weight=0.2 has no effect"):
        build_model("unet", 3, encoder="test_resnet", aux_weight=0.2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_model("vit", 3, depth=1, head_channels=16, aux_head=True, aux_weight=0.2)  # the aux head's
        build_model("unet", 3, encoder="test_resnet", head="mlp", attention="softmax")  # the default


@pytest.mark.parametrize("name", available_models())
def test_model_config_composes_and_builds_at_its_defaults(name: str) -> None:
    """The yaml's own values, without a warning; the saved config (model.config) rebuilds it."""
    kwargs = composed(name)
    assert set(kwargs) <= set(model_options(name)) | {"name"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = build_model(**kwargs)
    assert model.config == kwargs
    rebuilt = build_model(**model.config)
    assert {k: v.shape for k, v in rebuilt.state_dict().items()} == {
        k: v.shape for k, v in model.state_dict().items()
    }


@pytest.mark.parametrize(("name", "head"), FAMILY_HEADS)
def test_model_config_builds_with_every_head(tiny_family_options, name: str, head: str) -> None:
    """``model=<name> model.head=<head>``: every key the yaml sets is accepted with any head."""
    kwargs = {**composed(name, f"model.head={head}"), **tiny_family_options[name]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # unet + a non-unet head: no part uses the attention
        model = build_model(**kwargs)
        rebuilt = build_model(**model.config)
    assert model.config["head"] == head
    assert type(model.head) is type(rebuilt.head) is HEAD_CLASSES[head]


# Where a family's yaml differs from the declared default on purpose: the value and why.
YAML_PRESETS = {
    ("efficientvit", "head_channels"): 32,  # EfficientViT-Seg b0's width, over the common 256
}


@pytest.mark.parametrize("name", available_models())
def test_model_yaml_states_the_declared_defaults(name: str) -> None:
    """Each option is declared once, in options.py: conf/model/<family>.yaml repeats its default (so that
    ``--help`` lists it and the type check knows it) and may not drift from it, as pvt.yaml's
    drop_path_rate 0.1 did from PVTOptions' 0.0; ``head`` names the family's default head."""
    yaml = OmegaConf.to_container(OmegaConf.load(CONF / "model" / f"{name}.yaml"))
    family = MODEL_FAMILIES[name]
    schemas = (family.options, CommonOptions, *(head.options for head in HEADS.values()))
    declared = {
        f.name: f.default if f.default is not MISSING else f.default_factory()
        for schema in schemas
        for f in fields(schema)
        if f.default is not MISSING or f.default_factory is not MISSING
    }
    assert yaml.pop("name") == name and yaml.pop("head") == family.default_head
    assert isinstance(yaml.pop("compile"), bool)  # how to train, not what to build: train.py's
    drift = {
        key: (value, declared.get(key, "undeclared"))
        for key, value in yaml.items()
        if value != YAML_PRESETS.get((name, key), declared.get(key, "undeclared"))
    }
    assert drift == {}
