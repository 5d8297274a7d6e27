"""The data configs' default ``num_workers`` (``${workers:N}``) never exceeds the cores available: N loader
processes where there are N cores or more, one per core below that. eval.py caps the value recorded in a
checkpoint (resolved on the training machine) the same way; a value set on the command line is kept."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from omegaconf import DictConfig, OmegaConf
from train_overrides import CONF, compose_config

from segattn.config import resolvers
from segattn.evaluation.command import data_config
from segattn.record import ModelRecord

DATASETS = sorted(path.stem for path in (CONF / "data").glob("*.yaml"))


def written_default(dataset: str) -> int:
    """The count conf/data/<dataset>.yaml asks for: N of ``${workers:N}``, or a plain number."""
    value = str(OmegaConf.to_container(OmegaConf.load(CONF / "data" / f"{dataset}.yaml"))["num_workers"])
    match = re.fullmatch(r"\$\{workers:(\d+)\}|(\d+)", value)
    assert match, f"conf/data/{dataset}.yaml: num_workers: {value}"
    return int(match.group(1) or match.group(2))


@pytest.mark.parametrize("cores", [1, 2, 64])
@pytest.mark.parametrize("dataset", DATASETS)
def test_the_default_never_exceeds_the_cores(monkeypatch, tmp_path, dataset, cores):
    monkeypatch.setattr(resolvers, "available_cores", lambda: cores)
    cfg = compose_config([f"data={dataset}", f"data.root={tmp_path}"])
    asked = written_default(dataset)
    assert cfg.data.num_workers == min(asked, cores) <= cores


def test_the_camvid_default_is_four_workers_or_the_cores(monkeypatch, tmp_path):
    for cores, expected in [(1, 1), (2, 2), (4, 4), (16, 4)]:
        monkeypatch.setattr(resolvers, "available_cores", lambda cores=cores: cores)
        assert compose_config(["data=camvid", f"data.root={tmp_path}"]).data.num_workers == expected


def test_a_value_on_the_command_line_is_kept(monkeypatch, tmp_path):
    monkeypatch.setattr(resolvers, "available_cores", lambda: 2)
    cfg = compose_config(["data=camvid", f"data.root={tmp_path}", "data.num_workers=6"])
    assert cfg.data.num_workers == 6


def test_the_available_cores_are_the_process_s_share_of_the_machine():
    """A process pinned to one core (a job's CPU affinity) counts one, whatever the machine has."""
    pinned = (
        "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
        "from segattn.config import available_cores; print(available_cores())"
    )
    result = subprocess.run([sys.executable, "-c", pinned], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "1"


def eval_config(**data) -> DictConfig:
    return OmegaConf.create({"checkpoint": "model.ckpt", "data": {"name": None, "root": None, **data}})


def test_eval_caps_the_workers_recorded_on_a_larger_machine(monkeypatch):
    monkeypatch.setattr(resolvers, "available_cores", lambda: 2)
    record = ModelRecord(
        {"name": "vit", "num_classes": 5},
        [str(k) for k in range(5)],
        [(k, k, k) for k in range(5)],
        dataset="synthetic",
        data_config={"name": "synthetic", "num_workers": 4, "val_batch_size": 1},
    )
    assert data_config(eval_config(), record)["num_workers"] == 2
    assert data_config(eval_config(num_workers=3), record)["num_workers"] == 3  # asked for: kept
    monkeypatch.setattr(resolvers, "available_cores", lambda: 16)
    assert data_config(eval_config(), record)["num_workers"] == 4
