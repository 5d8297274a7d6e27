"""Checkpoint helpers: the ckpt_path=last rule, fine-tuning weight loads, RNG state round trips."""

import os
import random

import numpy as np
import pytest
import torch
from torch import nn

from segattn.checkpoints.resume import (
    find_last_checkpoint,
    load_weights,
    read_checkpoint,
    resolve_ckpt_path,
    restore_rng_state,
    rng_state,
)


def touch(path, mtime):
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": {}}, path)
    os.utime(path, (mtime, mtime))
    return path


def test_last_is_the_newest_last_ckpt_of_earlier_runs(tmp_path):
    older = touch(tmp_path / "runs/a/checkpoints/last.ckpt", 1_000)
    newer = touch(tmp_path / "multiruns/x/0_job/checkpoints/last.ckpt", 2_000)
    touch(tmp_path / "runs/b/checkpoints/best.ckpt", 3_000)  # not a last.ckpt
    fresh_run = tmp_path / "runs/now"  # a new run's own directory, no checkpoint yet
    assert find_last_checkpoint(tmp_path, exclude=fresh_run) == newer
    assert resolve_ckpt_path("last", tmp_path, fresh_run) == newer
    assert resolve_ckpt_path(str(older), tmp_path, fresh_run) == older
    assert resolve_ckpt_path(None, tmp_path, fresh_run) is None


def test_a_requeued_run_resumes_its_own_directory_first(tmp_path):
    """A job re-run with the same command into a fixed hydra.run.dir: its own last.ckpt wins over a newer
    one of another run; ``auto`` starts fresh when the run has none and never looks elsewhere."""
    own = touch(tmp_path / "job42/checkpoints/last.ckpt", 1_000)
    touch(tmp_path / "runs/other/checkpoints/last.ckpt", 2_000)
    assert resolve_ckpt_path("last", tmp_path, tmp_path / "job42") == own
    assert resolve_ckpt_path("auto", tmp_path, tmp_path / "job42") == own
    assert resolve_ckpt_path("auto", tmp_path, tmp_path / "job43") is None


def test_missing_checkpoints_are_reported_with_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no last\.ckpt in this run's directory .*run nor under"):
        resolve_ckpt_path("last", tmp_path, tmp_path / "run")
    with pytest.raises(FileNotFoundError, match=r"nope\.ckpt"):
        resolve_ckpt_path(str(tmp_path / "nope.ckpt"), tmp_path, tmp_path / "run")


def test_load_weights_copies_matching_tensors_and_skips_other_shapes(tmp_path):
    source = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 5))  # "head" for 5 classes
    target = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))  # fine-tune for 2 classes
    state = {f"model.{key}": value for key, value in source.state_dict().items()}
    state["criterion.class_weights"] = torch.ones(5)  # other prefixes are not model weights
    path = tmp_path / "source.ckpt"
    torch.save({"state_dict": state}, path)
    head_before = target[1].weight.clone()
    report = load_weights(target, path)
    assert torch.equal(target[0].weight, source[0].weight)
    assert torch.equal(target[1].weight, head_before)
    assert report["loaded"] == ["0.bias", "0.weight"]
    assert report["skipped"] == ["1.bias", "1.weight"]


def test_checkpoints_are_read_without_unpickling_code(tmp_path):
    path = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "hook": print}, path)  # a callable inside the file
    with pytest.raises(Exception, match=r"(?i)weights.only|unsupported global"):
        read_checkpoint(path)


def test_rng_state_survives_a_weights_only_round_trip(tmp_path):
    path = tmp_path / "rng.ckpt"
    torch.save({"state_dict": {}, "rng_states": rng_state()}, path)
    expected = (torch.rand(3), np.random.rand(3), random.random())
    restore_rng_state(read_checkpoint(path)["rng_states"])
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(expected[0], again[0])
    assert np.array_equal(expected[1], again[1])
    assert expected[2] == again[2]
