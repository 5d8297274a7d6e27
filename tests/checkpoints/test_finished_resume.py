"""Resuming from a copy of another run's last.ckpt: a finished checkpoint says there is nothing left to
train (status 0, one line, no run directory), and a run that trains on tests only its own checkpoints,
never the best.ckpt path stored in the copied checkpoint (a file of the other run, which may hold another
model by now or be gone)."""

from __future__ import annotations

import shutil
import sys

import pytest
import torch
from reliability_fixtures import TINY, compose_run

from segattn import cli
from segattn.training.run import run

ONE_EPOCH = [*TINY, "logger=none", "trainer.max_epochs=1", "data.num_test=2"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished one-epoch run (the other run), and a copy of its last.ckpt."""
    root = tmp_path_factory.mktemp("finished")
    summary = run(compose_run(root, *ONE_EPOCH, "test_after_fit=false", run="other"))
    assert summary["best_checkpoint"] == str(root / "other" / "checkpoints" / "best.ckpt")
    copy = root / "copy.ckpt"
    shutil.copy(root / "other" / "checkpoints" / "last.ckpt", copy)
    return root, copy


def test_resuming_a_finished_run_says_there_is_nothing_left_to_train(finished, tmp_path, monkeypatch, capsys):
    _, copy = finished
    logs = tmp_path / "logs"
    logs.mkdir()
    argv = [f"paths.log_dir={logs}", f"hydra.run.dir={logs / 'b'}", "hydra/job_logging=none"]
    monkeypatch.setattr(sys, "argv", ["train.py", *argv, *ONE_EPOCH, f"ckpt_path={copy}"])
    assert cli.train() is None  # Hydra returns: status 0
    out = capsys.readouterr().out.strip().splitlines()
    expected = (
        f"train.py: ckpt_path={copy}: nothing left to train: the checkpoint has finished 1 epoch(s) "
        "(step 2), trainer.max_epochs=1; raise trainer.max_epochs"
    )
    assert any(line.startswith(expected) for line in out), out[-5:]
    assert not any(logs.iterdir())


def test_a_resumed_run_tests_only_its_own_checkpoints(finished, tmp_path):
    root, copy = finished
    (root / "other" / "checkpoints" / "best.ckpt").unlink()  # the other run's best is gone (or replaced)
    summary = run(
        compose_run(
            tmp_path,
            *ONE_EPOCH,
            "trainer.max_epochs=2",  # one more epoch, without validation: no best checkpoint of its own
            "trainer.limit_val_batches=0",
            f"ckpt_path={copy}",
        )
    )
    assert summary["steps"] == 4 and summary["best_checkpoint"] is None
    assert summary["test"]["mIoU"] >= 0 and summary["test_note"].endswith("the final weights")
    last = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["global_step"] == 4
