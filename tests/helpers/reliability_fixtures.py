"""Helpers shared by the fault and crash tests (training, checkpoints, data, cli): the real conf/ composed
into tiny runs, and train.py started as a new process (forked from the warm server, ``warm_processes``),
able to load the test-only fault callbacks (``fault_callbacks``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from omegaconf import DictConfig
from train_overrides import TINY_MODEL, compose_config
from warm_processes import Job, start
from warm_processes import run as run_command

from segattn import files

HELPERS = Path(__file__).resolve().parent
TRAIN_SCRIPT = HELPERS.parents[1] / "train.py"

# CPU, quiet, no sanity validation; tiny models below and 32x32 synthetic images: steps take milliseconds.
RUN = [
    "attention=linear",
    "trainer.accelerator=cpu",
    "trainer.num_sanity_val_steps=0",
    "callbacks.rich_progress_bar=null",
    "callbacks.rich_model_summary=null",
    "callbacks.wandb_panel=null",
]
SYNTHETIC = [
    "data=synthetic",
    "data.image_size=[32,32]",
    "data.crop_size=[32,32]",
    "data.num_train=8",
    "data.num_val=2",
    "data.batch_size=4",
    "data.val_batch_size=2",
]
BASE = [*SYNTHETIC, *RUN]
VIT = TINY_MODEL["vit"]
UNET = TINY_MODEL["unet"]  # has BatchNorm buffers
TINY = [*BASE, *VIT]


def compose_run(tmp_path: Path, *overrides: str, run: str = "run") -> DictConfig:
    """The config ``python train.py <overrides>`` gives ``segattn.training.run``, writing to tmp_path/run."""
    paths = [f"paths.log_dir={tmp_path}", f"paths.output_dir={tmp_path / run}", "hydra/job_logging=none"]
    return compose_config([*paths, *overrides])


def train_command(tmp_path: Path, *overrides: str, run: str = "run") -> list[str]:
    """``python train.py`` writing to tmp_path/run."""
    return [
        sys.executable,
        str(TRAIN_SCRIPT),
        f"paths.log_dir={tmp_path}",
        f"hydra.run.dir={tmp_path / run}",
        *overrides,
    ]


def train_env() -> dict[str, str]:
    """A training job's environment: offline W&B with its own wandb-core service, and this folder on the
    PYTHONPATH, for ``+callbacks.<name>._target_=fault_callbacks.<Class>``. WANDB_SERVICE is dropped: an
    earlier in-process W&B test exports it, and a child inheriting it would share pytest's service, where a
    SIGKILLed run's id stays registered and its resume is refused as "run ID is in use"."""
    env = {key: value for key, value in os.environ.items() if key != "WANDB_SERVICE"}
    path = os.pathsep.join(part for part in (str(HELPERS), env.get("PYTHONPATH")) if part)
    return env | {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "HF_HUB_OFFLINE": "1", "PYTHONPATH": path}


def start_train(
    tmp_path: Path,
    *overrides: str,
    run: str = "run",
    stdout: int | Path = subprocess.PIPE,
    stderr: int | Path = subprocess.PIPE,
    new_session: bool = False,
) -> Job:
    """Start training as a new process (forked warm: ``warm_processes``), not waited for. ``stdout`` and
    ``stderr``: ``subprocess.PIPE``, a file, or for stderr ``subprocess.STDOUT``; ``new_session``: its own
    process group."""
    return start(
        train_command(tmp_path, *overrides, run=run),
        cwd=tmp_path,
        env=train_env(),
        stdout=stdout,
        stderr=stderr,
        start_new_session=new_session,
    )


def run_train(
    tmp_path: Path, *overrides: str, run: str = "run", timeout: int = 180
) -> subprocess.CompletedProcess:
    """Run training as a new process (``start_train``) to completion (or failure) within ``timeout`` s."""
    return run_command(
        train_command(tmp_path, *overrides, run=run), cwd=tmp_path, env=train_env(), timeout=timeout
    )


def refuse(errno_code: int, under: Path):
    """``os.open`` refusing to create files below ``under`` with ``errno_code``, as a full disk, a read-only
    mount or a folder of another user does (root, which runs CI, may write into any chmod-ed folder)."""
    real_open = files.os.open

    def fake_open(path, flags, mode=0o777):
        if Path(path).is_relative_to(under):
            raise OSError(errno_code, "refused by the test", str(path))
        return real_open(path, flags, mode)

    return fake_open
