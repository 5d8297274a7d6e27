"""Loading checkpoints and exported models never runs code found in a file: pickles are read with
weights_only=True at every entry point (a pickle bomb is refused), YAML with safe_load, and models are
rebuilt from registry names; a saved config naming a callable or a Hydra ``_target_`` is refused."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from hydra.utils import instantiate
from reliability_fixtures import BASE, VIT, compose_run

from segattn import open_model
from segattn.checkpoints.resume import load_weights, read_checkpoint
from segattn.models import build_model
from segattn.models.pretrained import read_weights_file
from segattn.training import run as train
from segattn.training.checkpointing import AtomicCheckpointIO

TINY_VIT = {"embed_dim": 16, "depth": 1, "num_heads": 2, "patch_size": 8, "head_channels": 8}


class Bomb:
    """Unpickling it runs ``touch <marker>``: what a malicious checkpoint would do with a real command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture
def no_shell(monkeypatch):
    """Record (and block) every call to the usual ways of running a command."""
    calls = []

    def record(*args, **kwargs):
        calls.append(args)
        return 0

    for module, name in ((os, "system"), (subprocess, "call"), (subprocess, "run"), (subprocess, "Popen")):
        monkeypatch.setattr(module, name, record)
    return calls


def checkpoint(tmp_path: Path, model_config: dict, data: dict | None = None, **section: object) -> Path:
    """A train.py-style checkpoint (a tiny ViT's weights) whose saved model config is ``model_config``, with
    ``section``'s further entries (``wandb_run_id``, ``inference``) beside it."""
    model = build_model("vit", num_classes=3, attention="linear", **TINY_VIT)
    state = {f"model.{key}": value for key, value in model.state_dict().items()}
    path = tmp_path / "model.ckpt"
    segattn = {"model": model_config, "data": data or {}, **section}
    torch.save({"state_dict": state, "segattn": segattn}, path)
    return path


def test_pickle_bomb_is_refused_at_every_entry_point(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "bomb.ckpt"
    torch.save({"state_dict": {}, "segattn": {"model": {"name": "vit"}}, "payload": Bomb(marker)}, path)

    with pytest.raises(ValueError, match=r"refused to unpickle \(weights_only=True"):
        open_model(path)  # predict / export / user code
    with pytest.raises(Exception, match=r"(?i)weights.only|unsupported global"):
        read_checkpoint(path)  # ckpt_path resume, W&B run id
    with pytest.raises(Exception, match=r"(?i)weights.only|unsupported global"):
        load_weights(build_model("vit", num_classes=3, **TINY_VIT), path)  # init_from
    with pytest.raises(Exception, match=r"(?i)weights.only|unsupported global"):
        AtomicCheckpointIO().load_checkpoint(path, weights_only=True)  # Lightning's own restore
    for key in ("ckpt_path", "init_from"):  # whole training runs pointed at it
        cfg = compose_run(tmp_path, *BASE, *VIT, f"{key}={path}", "logger=none", run=key)
        with pytest.raises(Exception, match=r"(?i)weights.only|unsupported global"):
            train.run(cfg)
    assert not marker.exists()

    torch.load(path, weights_only=False)  # the payload is real: a plain unpickle runs it
    assert marker.exists()


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"name": "os.system"}, "unknown model 'os.system'; expected one of: efficientvit, pvt, unet, vit"),
        ({"attention": "os.system"}, "unknown attention 'os.system'"),
        ({"head": "subprocess.call"}, "unknown head 'subprocess.call'"),
        ({"_target_": "os.system", "command": "touch pwned"}, "segattn.model._target_ is refused"),
        (
            {"attention_options": {"_target_": "builtins.exec", "_args_": ["import os"]}},
            "segattn.model.attention_options._target_ is refused",
        ),
        ({"num_classes": {"_call_": True}}, "segattn.model.num_classes._call_ is refused"),
    ],
)
def test_saved_config_naming_a_callable_is_refused_without_calling_it(tmp_path, no_shell, change, expected):
    config = {"name": "vit", "num_classes": 3, "attention": "linear", "attention_options": {}, **TINY_VIT}
    path = checkpoint(tmp_path, {**config, **change})
    with pytest.raises(ValueError) as error:
        open_model(path)
    assert str(path) in str(error.value) and expected in str(error.value)
    assert no_shell == []


def test_config_callable_outside_the_model_entry_is_refused(tmp_path, no_shell):
    config = {"name": "vit", "num_classes": 3, "attention": "linear", "attention_options": {}, **TINY_VIT}
    path = checkpoint(tmp_path, config, data={"classes": {"_target_": "os.system", "_args_": ["id"]}})
    with pytest.raises(ValueError, match=r"segattn\.data\.classes\._target_ is refused"):
        open_model(path)
    assert no_shell == []


# Instantiated, it creates the file "pwned" (Hydra blocks os.system and its kind, not this).
PAYLOAD = {"_target_": "logging.FileHandler", "_args_": ["pwned"]}


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ({"wandb_run_id": PAYLOAD}, "segattn.wandb_run_id._target_"),
        ({"inference": {"mode": "whole", **PAYLOAD}}, "segattn.inference._target_"),
        ({"data": {"config": {"name": PAYLOAD}}}, "segattn.data.config.name._target_"),
    ],
    ids=["W&B run id", "inference", "data config"],
)
def test_resuming_a_checkpoint_that_stores_a_target_is_refused_before_anything_is_built(
    tmp_path, monkeypatch, section, key
):
    """Resuming takes the W&B run id its logger continues from the checkpoint, beside the recorded data and
    inference config: none is ever instantiated, and a Hydra key in any of them refuses the file in one line
    naming it and the key, before a logger, a trainer or the run's config exists."""
    config = {"name": "vit", "num_classes": 5, "attention": "linear", "attention_options": {}, **TINY_VIT}
    monkeypatch.chdir(tmp_path)  # where the payload would write its file
    path = checkpoint(tmp_path, config, **section)
    monkeypatch.setattr(train, "build_loggers", pytest.fail)
    cfg = compose_run(tmp_path, *BASE, *VIT, f"ckpt_path={path}", "logger=wandb")
    with pytest.raises(ValueError) as error:
        train.run(cfg)
    message = str(error.value)
    assert message.startswith(f"ckpt_path={path}: {key} is refused: saved configs name models by registry")
    assert "\n" not in message
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "run" / ".hydra").exists()

    instantiate(PAYLOAD).close()  # the payload is real
    assert (tmp_path / "pwned").exists()


def test_a_clean_checkpoint_rebuilds_from_registry_names(tmp_path):
    config = {"name": "vit", "num_classes": 3, "attention": "linear", "attention_options": {}, **TINY_VIT}
    opened = open_model(checkpoint(tmp_path, config))
    assert opened.record.model == config and opened.network.num_classes == 3


def test_exported_model_yaml_with_python_tags_or_target_is_refused(tmp_path, no_shell):
    marker = tmp_path / "pwned"
    export = tmp_path / "export"
    export.mkdir()
    (export / "model.safetensors").write_bytes(b"")
    evil = f"model: !!python/object/apply:os.system ['touch {marker}']\n"
    (export / "model.yaml").write_text(evil)
    with pytest.raises((ValueError, yaml.YAMLError), match=r"python/object/apply:os\.system"):
        open_model(export)
    assert no_shell == []
    yaml.unsafe_load(evil)  # the payload is real: an unsafe load calls os.system (recorded, not run)
    assert no_shell == [(f"touch {marker}",)]
    no_shell.clear()
    (export / "model.yaml").write_text("model: {_target_: os.system, command: touch pwned}\n")
    with pytest.raises(ValueError, match=r"model\.yaml\.model\._target_ is refused"):
        open_model(export)
    assert no_shell == [] and not marker.exists()


def test_a_refused_pickle_says_it_asks_to_run_code_and_names_the_call(tmp_path):
    """A weights file with a pickled object beside its tensors (model.pretrained, ckpt_path, init_from,
    checkpoint=): the line says why it is refused and what it would call, and never suggests turning the
    protection off (torch's own message suggests weights_only=False)."""
    marker = tmp_path / "pwned"
    path = tmp_path / "release.pth"
    torch.save({"model": {"w": torch.zeros(2)}, "state_dict": {}, "config": Bomb(marker)}, path)
    call = f"{os.system.__module__}.system"  # posix.system on Linux
    for key, read in (("model.pretrained", read_weights_file), ("ckpt_path", read_checkpoint)):
        with pytest.raises(ValueError) as error:
            read(path) if key == "model.pretrained" else read(path, key)
        message = str(error.value)
        assert message.startswith(f"{key}={path}: refused to unpickle (weights_only=True): the file asks to ")
        assert f"run code: when unpickled it would import and may call {call}." in message
        assert "weights_only=False" not in message and "\n" not in message
    assert not marker.exists()


def test_a_file_that_is_not_weights_is_named_in_one_line(tmp_path):
    """model.pretrained=/etc/passwd used to end in a Hydra traceback from the unpickler's IndexError."""
    text = tmp_path / "passwd"
    text.write_text("root:x:0:0:root:/root:/bin/bash\n")
    with pytest.raises(ValueError) as error:
        build_model("vit", num_classes=3, attention="linear", pretrained=str(text), **TINY_VIT)
    assert str(error.value) == (
        f"model.pretrained={text}: not a weights file: a file of 32 bytes starting with b'root'; expected a "
        ".safetensors file or a torch.save state_dict (.pth, .pt, .bin, .ckpt)"
    )
