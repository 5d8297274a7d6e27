"""``trainer=fsdp_cpu``: two gloo processes with FSDP2 sharding per block train the same parameters as one
process training on both processes' images, and a run resumed mid-epoch from its checkpoint (weights,
AdamW moments, RNG, the epoch's remaining batches) ends exactly as the uninterrupted run. Also: which
modules are sharded as units, and the settings ``trainer=fsdp`` refuses."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lightning_fabric.plugins.environments.lightning import find_free_network_port
from train_overrides import QUIET, REPO, TINY_DATA, TINY_MODEL, compose_config
from warm_processes import Job, start

from segattn.models import build_model
from segattn.training.config_checks import check_config
from segattn.training.fsdp import FullyShardedStrategy, shard_units
from segattn.training.run import run

# Four images, no random flips, no dropout: one optimizer step per epoch sees all four images, two per
# process under FSDP, four at once in one process; every pixel is labelled, so the mean loss over four
# images is the mean of the two processes' means, which FSDP's averaged gradients follow. The LR is
# constant (no warmup, poly with power 0); the clip norm is small enough to act on every step, so the
# clipping must use the norm of the whole, unsharded gradient.
COMMON = [
    *TINY_DATA,
    *TINY_MODEL["vit"],
    "model.dropout=0.0",
    "model.drop_path_rate=0.0",
    "model.grad_checkpointing=true",
    "data.num_train=4",
    "data.num_val=2",
    "data.num_test=2",
    "data.val_batch_size=1",
    "data.hflip=0.0",
    "scheduler.warmup_steps=0",
    "scheduler.power=0.0",
    "optimizer.lr=1e-3",
    "trainer.gradient_clip_val=0.01",
    "logger=none",
    "callbacks.rich_progress_bar=null",
    "callbacks.rich_model_summary=null",
]
FSDP = [*COMMON, "trainer=fsdp_cpu", "data.batch_size=2"]  # per process
RESUME = ["data.batch_size=1", "model.dropout=0.1", "trainer.max_epochs=2", "test_after_fit=false"]
SINGLE = [*COMMON, *QUIET, "data.batch_size=4", "test_after_fit=false"]


PORTS: set[int] = set()


def fresh_port() -> int:
    """A free port no earlier job of this module was given."""
    while (port := find_free_network_port()) in PORTS:
        pass
    PORTS.add(port)
    return port


def start_fsdp(log_dir: Path, run_name: str, *overrides: str) -> tuple[Job, Path]:
    """Start train.py with 2 FSDP processes; returns the job and its run directory. Each job gets its own
    free port (jobs run at the same time, and pytest's environment may hold an earlier test's MASTER_PORT)."""
    run_dir = log_dir / run_name
    job = start(
        [
            sys.executable,
            str(REPO / "train.py"),
            *FSDP,
            *overrides,
            f"paths.log_dir={log_dir}",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=log_dir,
        env={**os.environ, "OMP_NUM_THREADS": "1", "MASTER_PORT": str(fresh_port())},
        stderr=subprocess.STDOUT,
    )
    return job, run_dir


def finish(started: tuple[Job, Path]) -> Path:
    """Wait for a job of ``start_fsdp`` to succeed; returns its last.ckpt."""
    job, run_dir = started
    output, _ = job.communicate(timeout=300)
    assert job.returncode == 0, output[-6000:]
    return run_dir / "checkpoints/last.ckpt"


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def max_difference(sharded: dict, single: dict) -> float:
    """Largest absolute difference over all model parameters (the same names on both sides)."""
    assert sharded.keys() == single.keys()
    return max((sharded[name] - single[name]).abs().max().item() for name in single)


@pytest.mark.slow
def test_fsdp_cpu_step_equals_single_process_and_resumes_mid_epoch(train_config, tmp_path):
    # Resume mid-epoch: two epochs of two steps (one image per process and step, dropout on), straight and
    # from the checkpoint after step 1, must end the same, with the same epoch count.
    resume = [
        *RESUME,
        "callbacks.model_checkpoint.monitor=null",
        "callbacks.model_checkpoint.save_top_k=-1",
        "callbacks.model_checkpoint.every_n_train_steps=1",
        "callbacks.model_checkpoint.filename='step{step}'",
    ]
    # The independent runs at the same time (each is mostly one busy core): the straight run, the FSDP step
    # against one process (two images per process, with validation and the test of the best checkpoint),
    # and the one-process step on all four images, in this process.
    straight_job = start_fsdp(tmp_path, "fsdp_straight", *resume)
    first_job = start_fsdp(tmp_path, "fsdp_first", "trainer.max_epochs=1")
    run(train_config(*SINGLE, "trainer.max_epochs=1", run="single"))
    single = load(tmp_path / "single/checkpoints/last.ckpt")

    first = load(finish(first_job))
    assert first["global_step"] == 1
    step_1 = max_difference(first["state_dict"], single["state_dict"])
    assert step_1 < 1e-6

    straight = load(finish(straight_job))
    resumed = load(
        finish(
            start_fsdp(
                tmp_path,
                "fsdp_resumed",
                *resume,
                f"ckpt_path={tmp_path / 'fsdp_straight/checkpoints/step1.ckpt'}",
            )
        )
    )
    assert (
        (resumed["epoch"], resumed["global_step"]) == (straight["epoch"], straight["global_step"]) == (1, 4)
    )
    resume_error = max_difference(resumed["state_dict"], straight["state_dict"])
    print(
        f"FSDP vs one process, max |Δparam| after one step: {step_1:.2e}; "
        f"resumed mid-epoch vs straight: {resume_error:.2e}"
    )
    assert resume_error == 0.0


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (
            dict(name="vit", embed_dim=32, depth=2, num_heads=2, patch_size=8),
            ["encoder.blocks.0", "encoder.blocks.1"],
        ),
        (
            dict(name="unet", encoder="test_resnet"),
            [f"head.attn_blocks.{i}" for i in range(4)] + [f"encoder.model.layer{i}" for i in range(1, 5)],
        ),
    ],
)
def test_shard_units_are_the_blocks_and_cnn_stages(options, expected):
    model = build_model(num_classes=3, attention="linear", **options)
    names = {id(module): name for name, module in model.named_modules()}
    assert [names[id(unit)] for unit in shard_units(model)] == expected


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.precision=16-mixed"], r"trainer\.precision=16-mixed with trainer\.strategy\.name=fsdp"),
        (["model.compile=true"], r"model\.compile=true with trainer\.strategy\.name=fsdp"),
        (["trainer.strategy=fsdp"], r"trainer\.strategy=fsdp: Lightning's FSDP1 .* expected trainer=fsdp"),
    ],
)
def test_fsdp_refuses_unsupported_settings(overrides, message, tmp_path):
    cfg = compose_config(["trainer=fsdp", *overrides, f"paths.output_dir={tmp_path}"])
    with pytest.raises(ValueError, match=message):
        check_config(cfg)


def test_sharded_checkpoint_folders_are_refused():
    with pytest.raises(ValueError, match="save_distributed_checkpoint=true: sharded checkpoint folders"):
        FullyShardedStrategy(save_distributed_checkpoint=True)
