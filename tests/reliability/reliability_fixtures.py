"""Helpers shared by the reliability tests: the real conf/ composed into tiny runs, and train.py started
as a subprocess (through train_with_faults.py, which adds test-only fault callbacks)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

from segattn.config import register_resolvers

REPO = Path(__file__).resolve().parents[2]
FAULTS_SCRIPT = Path(__file__).with_name("train_with_faults.py")

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
VIT = [
    "model=vit",
    "model.embed_dim=32",
    "model.depth=2",
    "model.num_heads=2",
    "model.patch_size=8",
    "model.head_channels=16",
]
UNET = ["model=unet", "model.encoder=test_resnet", "model.head_channels=16"]  # has BatchNorm buffers
TINY = [*BASE, *VIT]


def compose_run(tmp_path: Path, *overrides: str, run: str = "run") -> DictConfig:
    """The config ``python train.py <overrides>`` passes to ``segattn.train.run``, writing to tmp_path/run."""
    register_resolvers()
    with initialize_config_dir(str(REPO / "conf"), version_base="1.3"):
        cfg = compose(
            "train",
            overrides=[
                f"paths.log_dir={tmp_path}",
                f"paths.output_dir={tmp_path / run}",
                "hydra/job_logging=none",
                *overrides,
            ],
            return_hydra_config=True,
        )
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


def train_command(tmp_path: Path, *overrides: str, run: str = "run") -> list[str]:
    """``python train_with_faults.py`` (= train.py + test fault callbacks) writing to tmp_path/run."""
    return [
        sys.executable,
        str(FAULTS_SCRIPT),
        f"paths.log_dir={tmp_path}",
        f"hydra.run.dir={tmp_path / run}",
        *overrides,
    ]


def train_env() -> dict[str, str]:
    return {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "HF_HUB_OFFLINE": "1"}


def run_train(
    tmp_path: Path, *overrides: str, run: str = "run", timeout: int = 180
) -> subprocess.CompletedProcess:
    """Run training in a subprocess to completion (or failure) within ``timeout`` seconds."""
    return subprocess.run(
        train_command(tmp_path, *overrides, run=run),
        cwd=tmp_path,
        env=train_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
