"""Overrides and config composition shared by the tests that compose or run train.py (training, checkpoints,
evaluation, parallel, the config tests): the real conf/ with tiny-run settings.

A plain module in tests/helpers/ (on sys.path through pyproject.toml's ``pythonpath``), imported by a name no
test folder uses."""

from __future__ import annotations

from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

from segattn.config import register_resolvers
from segattn.models import build_model

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"

# A few 32x32 synthetic images, read in-process: every run below takes seconds.
TINY_DATA = [
    "data=synthetic",
    "data.image_size=[32,32]",
    "data.crop_size=[32,32]",
    "data.num_train=8",
    "data.num_val=4",
    "data.num_test=4",
    "data.batch_size=4",
    "data.val_batch_size=2",
    "data.num_workers=0",
    "data.persistent_workers=false",
    "data.pin_memory=false",
]
# Per model family: select it, with the smallest widths its options allow.
TINY_MODEL = {
    "vit": [
        "model=vit",
        "model.embed_dim=32",
        "model.depth=2",
        "model.num_heads=2",
        "model.patch_size=8",
        "model.head_channels=16",
    ],
    "pvt": [
        "model=pvt",
        "model.embed_dims=[16,16,32,32]",
        "model.depths=[1,1,1,1]",
        "model.num_heads=[1,1,2,2]",
        "model.head_channels=16",
    ],
    "unet": ["model=unet", "model.encoder=test_resnet", "model.head_channels=16"],
    "efficientvit": [
        "model=efficientvit",
        "model.widths=[8,8,16,32,32]",
        "model.depths=[1,1,1,1,1]",
        "model.head_dim=8",
        "model.head_channels=8",
    ],
}


def tiny_pvt(aux_head: bool = False) -> torch.nn.Module:
    """A seeded 3-class pvt with ``linear`` attention, one block of width 8-16 a stage, no dropout or drop
    path: the loss tests' model, built directly (``TINY_MODEL`` is the same idea as train.py overrides)."""
    torch.manual_seed(0)
    return build_model(
        "pvt",
        num_classes=3,
        attention="linear",
        embed_dims=[8, 8, 16, 16],
        depths=[1, 1, 1, 1],
        num_heads=[1, 1, 1, 1],
        head_channels=8,
        dropout=0.0,
        drop_path_rate=0.0,
        aux_head=aux_head,
    )


# CPU, no progress bar or model table: quiet, quick runs.
QUIET = [
    "trainer=cpu",
    "callbacks.rich_progress_bar=null",
    "callbacks.rich_model_summary=null",
    "hydra/job_logging=none",
]


def compose_config(overrides: list[str], config_name: str = "train") -> DictConfig:
    """The config ``python <config_name>.py <overrides>`` would pass to ``run``; its ``hydra`` node is moved
    to ``HydraConfig.get()`` as in a real run."""
    register_resolvers()
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose(config_name, overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg
