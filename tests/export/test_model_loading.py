"""segattn.load_model: Lightning checkpoints and exported directories, rebuilt from registry names only."""

from __future__ import annotations

import os

import pytest
import torch
import yaml
from export_fixtures import CLASSES, MEAN, PALETTE, STD, tiny_model

import segattn
from segattn.checkpoints.loading import save_exported


def write_checkpoint(path, model, **overrides):
    """A checkpoint laid out as train.py writes it: weights under state_dict with prefix 'model.'."""
    meta = {
        "model": dict(model.config),
        "data": {
            "name": "synthetic",
            "classes": CLASSES,
            "palette": [list(c) for c in PALETTE],
            "ignore_index": 255,
            "mean": MEAN,
            "std": STD,
        },
        "wandb_run_id": None,
    }
    meta["model"].update(overrides)
    state = {f"model.{key}": value for key, value in model.state_dict().items()}
    state["criterion.weight"] = torch.ones(3)  # other LightningModule state is ignored
    torch.save({"state_dict": state, "segattn": meta, "epoch": 1}, path)
    return path


def test_checkpoint_loads_with_its_metadata_and_weights(tmp_path):
    model = tiny_model("flatten", seed=5)
    loaded, info = segattn.load_model(write_checkpoint(tmp_path / "last.ckpt", model))
    assert not loaded.training
    assert (info["classes"], info["palette"], info["mean"], info["num_classes"]) == (
        CLASSES,
        PALETTE,
        MEAN,
        3,
    )
    images = torch.randn(1, 3, 27, 45)
    with torch.inference_mode():
        assert torch.equal(loaded(images), model(images))


def test_pretrained_file_named_in_a_config_is_never_read(tmp_path):
    model = tiny_model("linear")
    path = write_checkpoint(tmp_path / "c.ckpt", model, pretrained=str(tmp_path / "absent.pth"))
    loaded, _ = segattn.load_model(path)  # the checkpoint's weights win; the file is not opened
    assert torch.equal(
        loaded.state_dict()["head.classifier.weight"], model.state_dict()["head.classifier.weight"]
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"_target_": "os.system"}, "_target_"),
        ({"name": "os.system"}, "unknown model 'os.system'"),
        ({"attention": "builtins.eval"}, "unknown attention 'builtins.eval'"),
        ({"attention_options": {"_partial_": True}}, "_partial_"),
    ],
)
def test_config_naming_a_callable_is_refused(tmp_path, overrides, message):
    path = write_checkpoint(tmp_path / "bad.ckpt", tiny_model("linear"), **overrides)
    with pytest.raises(ValueError, match=message) as error:
        segattn.load_model(path)
    assert "bad.ckpt" in str(error.value)


def test_pickled_object_in_a_checkpoint_is_refused_not_run(tmp_path):
    path = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "segattn": {"model": {"name": "vit"}}, "hook": os.system}, path)
    with pytest.raises(ValueError, match="refused to unpickle"):
        segattn.load_model(path)


def test_exported_directory_refuses_python_yaml_tags_and_names_missing_weights(tmp_path):
    model = tiny_model("linear")
    save_exported(
        model,
        {
            "model": model.config,
            "num_classes": 3,
            "classes": CLASSES,
            "palette": PALETTE,
            "mean": MEAN,
            "std": STD,
            "ignore_index": 255,
            "dataset": None,
        },
        tmp_path,
    )
    meta = yaml.safe_load((tmp_path / "model.yaml").read_text())
    assert meta["model"] == model.config and meta["data"]["mean"] == MEAN
    (tmp_path / "model.yaml").write_text("model: !!python/object/apply:os.system ['echo owned']\n")
    with pytest.raises(ValueError, match="not a plain YAML mapping"):
        segattn.load_model(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"missing model\.safetensors"):
        segattn.load_model(tmp_path)


def test_weights_that_do_not_match_the_config_name_the_file(tmp_path):
    path = write_checkpoint(tmp_path / "wide.ckpt", tiny_model("linear"), embed_dim=32)
    with pytest.raises(ValueError, match=r"wide\.ckpt: weights do not match"):
        segattn.load_model(path)
