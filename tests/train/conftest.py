"""The training tests' fixture: a composed config whose outputs go to the test's tmp_path."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from omegaconf import DictConfig
from train_overrides import compose_config


@pytest.fixture
def train_config(tmp_path: Path) -> Callable[..., DictConfig]:
    """``train_config(*overrides, run="name")``: a composed config whose outputs go to tmp_path/<run>."""

    def make(*overrides: str, run: str = "run") -> DictConfig:
        return compose_config([f"paths.log_dir={tmp_path}", f"paths.output_dir={tmp_path / run}", *overrides])

    return make
