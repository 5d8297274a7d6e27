"""A real ``kill -9`` of a training process mid-epoch, then ``ckpt_path=last``: training resumes from the
last checkpoint, continues the same W&B run and ends with exactly the weights of an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from reliability_fixtures import TINY, run_train, start_train
from warm_processes import Job

pytestmark = pytest.mark.slow

# Deterministic: one loader worker (its seed comes from the torch RNG the checkpoint carries), 3 epochs of
# 2 steps; warmup then poly decay so the LR differs at every step.
RUN = [
    *TINY,
    "data.num_workers=1",
    "trainer.max_epochs=3",
    "trainer.deterministic=true",
    "scheduler.warmup_steps=3",
    "optimizer.lr=1e-3",
    "logger=wandb",
]


def last_checkpoint(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)


def kill_when_parked(process: Job, marker: Path, timeout: float = 150) -> None:
    """SIGKILL the process group (trainer, loader worker, W&B service) once the run reaches the marker."""
    deadline = time.monotonic() + timeout
    try:
        while not marker.exists():
            assert process.poll() is None, process.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "training never reached the kill point"
            time.sleep(0.05)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate(timeout=30)


def test_kill_9_mid_epoch_then_resume_equals_uninterrupted(tmp_path):
    logs, straight_logs = tmp_path / "logs", tmp_path / "reference"  # ckpt_path=last searches logs only
    logs.mkdir()
    straight_logs.mkdir()
    marker = tmp_path / "parked"
    park = [
        "+callbacks.park_at._target_=fault_callbacks.ParkAt",
        "+callbacks.park_at.epoch=1",
        "+callbacks.park_at.batch=0",
        f"+callbacks.park_at.marker={marker}",
    ]
    # its own process group: the kill takes its children too, like a lost node
    victim = start_train(logs, *RUN, *park, run="killed", stderr=subprocess.STDOUT, new_session=True)
    straight = start_train(straight_logs, *RUN, "logger=none", run="straight", stderr=subprocess.STDOUT)
    kill_when_parked(victim, marker)
    assert victim.returncode == -signal.SIGKILL
    assert int(marker.read_text()) == 3  # killed after the first step of epoch 2 (steps 0-1 = epoch 1)

    killed = last_checkpoint(logs / "killed")
    assert (killed["epoch"], killed["global_step"]) == (0, 2)  # the end-of-epoch-1 checkpoint survived
    run_id = killed["segattn"]["wandb_run_id"]
    assert run_id and list((logs / "killed" / "wandb").glob(f"offline-run-*-{run_id}"))

    resumed = run_train(logs, *RUN, "ckpt_path=last", run="resumed")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    source = logs / "killed" / "checkpoints" / "last.ckpt"
    assert f"resuming from {source}" in resumed.stdout + resumed.stderr
    assert straight.wait(timeout=180) == 0, straight.communicate()[0][-3000:]

    final, reference = last_checkpoint(logs / "resumed"), last_checkpoint(straight_logs / "straight")
    assert (final["epoch"], final["global_step"]) == (reference["epoch"], reference["global_step"]) == (2, 6)
    assert final["state_dict"].keys() == reference["state_dict"].keys()
    for name, value in reference["state_dict"].items():
        assert torch.equal(final["state_dict"][name], value), name
    assert not torch.equal(  # the killed run's weights really were behind
        killed["state_dict"]["model.head.classifier.weight"],
        reference["state_dict"]["model.head.classifier.weight"],
    )
    # Same W&B run continued in the resumed run's directory.
    assert final["segattn"]["wandb_run_id"] == run_id
    assert list((logs / "resumed" / "wandb").glob(f"offline-run-*-{run_id}"))
