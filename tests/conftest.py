"""Fixtures every test folder can use. The helper modules shared by several folders (tiny-run overrides,
dataset, raster and export fixtures, band-parallel workers, fault-injecting train runs) are in
tests/helpers/, which pyproject.toml's ``pythonpath`` puts on sys.path."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig
from train_overrides import compose_config


@pytest.fixture
def exact_fp32() -> Iterator[None]:
    """TF32 off for matmuls and convolutions, so fp32 on a GPU means fp32 (cuDNN convolutions default to
    TF32); restored afterwards."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.fixture
def train_config(tmp_path: Path) -> Callable[..., DictConfig]:
    """``train_config(*overrides, run="name")``: a composed config whose outputs go to tmp_path/<run>
    (the training and checkpoint tests)."""

    def make(*overrides: str, run: str = "run") -> DictConfig:
        return compose_config([f"paths.log_dir={tmp_path}", f"paths.output_dir={tmp_path / run}", *overrides])

    return make
