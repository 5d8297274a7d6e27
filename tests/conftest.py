"""Fixtures every test folder can use. The helper modules shared by several folders (tiny-run overrides,
dataset, raster and export fixtures, band-parallel workers, fault-injecting train runs) are in
tests/helpers/, which pyproject.toml's ``pythonpath`` puts on sys.path."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

# Triton's interpreter for the Triton kernel tests (attention/, layers/test_depthwise_conv_gelu.py,
# layers/test_head_triton.py, training/test_fused_loss.py) on machines without a CUDA device.
# TRITON_INTERPRET is read when triton is first imported, which any import of torch._dynamo does (segattn's
# and the helpers' imports below among them): it is set here, before them. Harmless to the other tests:
# nothing else runs Triton kernels on the CPU. With a CUDA device the kernels run compiled.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from omegaconf import DictConfig
from train_overrides import compose_config

from segattn.config.resolvers import available_cores


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``make test`` runs ``-n auto``) each worker gets an equal share of the cores for
    torch's threads and for the processes its tests start (OMP_NUM_THREADS, unless already set): two
    workers with two threads each on two cores would wait on each other's threads. Offline, always."""
    # The commands the tests start never reach the Hugging Face Hub, as in CI; and huggingface_hub reads this
    # when imported, so the warm processes' server (tests/helpers/warm_processes.py) and they must agree.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers:
        threads = max(1, available_cores() // workers)
        torch.set_num_threads(threads)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Test files in order of how many slow tests they hold, most first (the rest as collected): pytest-xdist
    hands whole files to its workers in this order (``--no-loadscope-reorder``), so the long files start
    early and the short ones fill the gaps, instead of a long file finishing alone at the end."""
    slow = Counter(item.path for item in items if item.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow[item.path])


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
