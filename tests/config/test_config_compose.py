"""Every option of every config group, and every experiment, composes from the real conf/ and resolves."""

import os
from pathlib import Path

import pytest
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf
from train_overrides import CONF, REPO, compose_config

GLOBAL_GROUPS = ("experiment", "debug")  # these patch the whole config rather than filling one key
OTHER_COMMANDS = ("bench",)  # the bench's parts, composed by the bench (tests/bench), not by train.py
GROUP_OPTIONS = sorted(
    (group.name, option.stem)
    for group in CONF.iterdir()
    if group.is_dir() and group.name not in (*GLOBAL_GROUPS, *OTHER_COMMANDS, "hydra")
    for option in group.glob("*.yaml")
)


def resolved(cfg) -> dict:
    """The job's config with every interpolation resolved (mandatory ??? values left as they are)."""
    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)


def test_every_group_is_found():
    groups = {group for group, _ in GROUP_OPTIONS}
    expected = {
        "attention",
        "callbacks",
        "data",
        "logger",
        "loss",
        "model",
        "optimizer",
        "paths",
        "scheduler",
    }
    assert expected | {"trainer"} <= groups
    trainers = {option for group, option in GROUP_OPTIONS if group == "trainer"}
    assert trainers == {
        "default",
        "cpu",
        "gpu",
        "ddp",
        "ddp_cpu",
        "fsdp",
        "fsdp_cpu",
        "spatial",
        "spatial_cpu",
    }
    assert {option for group, option in GROUP_OPTIONS if group == "logger"} == {
        "wandb",
        "csv",
        "tensorboard",
        "mlflow",
        "none",
    }


@pytest.mark.parametrize(("group", "option"), GROUP_OPTIONS)
def test_group_option_composes(group, option, tmp_path):
    cfg = resolved(compose_config([f"{group}={option}", f"paths.output_dir={tmp_path}"]))
    assert cfg["run_name"] == f"{cfg['model']['name']}-{cfg['attention']['name']}-{cfg['data']['name']}"


@pytest.mark.parametrize("name", sorted(p.stem for p in (CONF / "experiment").glob("*.yaml")))
def test_experiment_composes(name, tmp_path):
    cfg = resolved(compose_config([f"experiment={name}", f"paths.output_dir={tmp_path}"]))
    defaults = OmegaConf.load(CONF / "experiment" / f"{name}.yaml").defaults
    while not any("override /data" in entry for entry in defaults if not isinstance(entry, str)):
        base = next(entry for entry in defaults if isinstance(entry, str))  # a recipe it builds on
        defaults = OmegaConf.load(CONF / "experiment" / f"{base}.yaml").defaults
    dataset = next(entry["override /data"] for entry in defaults if "override /data" in entry)
    assert cfg["data"]["name"] == dataset
    assert cfg["model"]["name"] == "pvt" and cfg["attention"]["name"] == "flatten"
    if dataset != "synthetic":  # generated on the fly: no root
        assert cfg["data"]["root"] == str(REPO / "data" / dataset)


@pytest.mark.parametrize("name", sorted(p.stem for p in (CONF / "debug").glob("*.yaml")))
def test_debug_config_composes(name, tmp_path):
    cfg = resolved(compose_config([f"debug={name}", f"paths.output_dir={tmp_path}"]))
    assert cfg["trainer"]["max_epochs"] >= 1


def test_default_config_and_paths_from_any_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # train.py may be started from anywhere
    cfg = compose_config([])
    assert (cfg.data.name, cfg.attention.name, cfg.logger.wandb.offline) == ("synthetic", "flatten", True)
    assert Path(cfg.paths.root_dir) == REPO
    assert Path(cfg.paths.data_dir) == REPO / "data"
    run_dir = Path(HydraConfig.get().run.dir)
    assert run_dir.parent == REPO / "outputs" / "runs"
    assert run_dir.name.endswith(cfg.run_name)
    assert Path(os.getcwd()) == tmp_path


def test_several_loggers_at_once(tmp_path):
    cfg = compose_config(["logger=[wandb,csv]", f"paths.output_dir={tmp_path}"])
    assert set(cfg.logger) == {"wandb", "csv"}
