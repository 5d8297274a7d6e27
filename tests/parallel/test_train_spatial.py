"""``python train.py trainer=spatial_cpu``: 2 gloo processes, one band each, train, validate and resume
through Lightning; after 1 step, a restart from last.ckpt and a second step, the weights equal 2 steps of
one-process training (fp32). A variant that needs all tokens fails before training, in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from train_overrides import REPO, TINY_MODEL, compose_config
from warm_processes import Job
from warm_processes import start as start_command

from segattn.training.run import run

pytestmark = pytest.mark.slow

# One 200×72 image (two bands of 128 and 96 padded rows), no random flip, no dropout: both runs see the
# same batches. The aux head and the SegFormer head's BatchNorm cross the bands too.
RUN = [
    "data=synthetic",
    "data.image_size=[200,72]",
    "data.crop_size=[200,72]",
    "data.num_train=1",
    "data.num_val=2",
    "data.batch_size=1",
    "data.val_batch_size=1",
    "data.hflip=0.0",
    *TINY_MODEL["pvt"],
    "model.dropout=0.0",
    "model.drop_path_rate=0.0",
    "model.aux_head=true",
    "attention=flatten",
    "optimizer.lr=0.1",
    "optimizer.eps=1.0",  # AdamW's steps ≈ lr · gradient (|g| ≪ eps): a wrong gradient scale shows, and a
    # rounding-noise gradient (a bias before BatchNorm) does not take a full ±lr step as at eps=1e-8
    "scheduler=poly",  # constant LR: the same schedule whatever max_steps, so 1 + 1 resumed steps = 2 steps
    "scheduler.warmup_steps=0",
    "scheduler.power=0.0",
    "trainer.gradient_clip_val=null",  # clipping by norm would hide a wrong gradient scale too
    "test_after_fit=false",
    "trainer.num_sanity_val_steps=0",
    "logger=csv",
    "callbacks.rich_progress_bar=null",
    "callbacks.rich_model_summary=null",
    "callbacks.wandb_panel=null",
]


def start(tmp_path: Path, *overrides: str) -> Job:
    """``python train.py`` writing to tmp_path/run (forked warm: ``warm_processes``), not waited for
    (``train`` waits)."""
    env = {key: value for key, value in os.environ.items() if key != "WANDB_SERVICE"}
    command = [
        sys.executable,
        str(REPO / "train.py"),
        f"paths.log_dir={tmp_path}",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    return start_command([*command, *RUN, *overrides], cwd=tmp_path, env=env | {"OMP_NUM_THREADS": "1"})


def train(tmp_path: Path, *overrides: str, job: Job | None = None) -> subprocess.CompletedProcess:
    """Run ``python train.py`` (or wait for ``job`` from ``start``) to completion."""
    job = job or start(tmp_path, *overrides)
    stdout, stderr = job.communicate(timeout=300)
    return subprocess.CompletedProcess(job.args, job.returncode, stdout, stderr)


def weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]


def test_spatial_training_resumes_and_equals_one_process(tmp_path):
    # The one-process run (in this process) trains while the first spatial run starts: neither waits for
    # the other, and each is mostly one busy core.
    first_job = start(tmp_path, "trainer=spatial_cpu", "trainer.max_steps=1")
    single_dir = tmp_path / "single"
    run(
        compose_config(
            [
                *RUN,
                "trainer=cpu",
                "trainer.max_steps=2",
                f"paths.log_dir={single_dir}",
                f"paths.output_dir={single_dir}",
                "hydra/job_logging=none",
            ]
        )
    )
    first = train(tmp_path, job=first_job)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    second = train(tmp_path, "trainer=spatial_cpu", "trainer.max_steps=2", "ckpt_path=last")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "resuming from" in second.stdout + second.stderr

    spatial, single = (
        weights(tmp_path / "run/checkpoints/last.ckpt"),
        weights(single_dir / "checkpoints/last.ckpt"),
    )
    assert spatial.keys() == single.keys()
    for name, value in single.items():
        if value.is_floating_point():
            torch.testing.assert_close(
                spatial[name], value, rtol=1e-5, atol=1e-6, msg=name
            )  # measured 2.8e-7


def test_variant_that_needs_all_tokens_is_refused_before_training(tmp_path):
    result = train(tmp_path, "trainer=spatial_cpu", "attention=softmax")
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if "needs all tokens" in line]
    assert len(lines) == 1 and "use attention=efficient, linear, taylor, flatten or performer" in lines[0]
    assert not (tmp_path / "run" / "checkpoints").exists()
