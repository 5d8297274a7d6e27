"""``trainer=ddp_cpu`` with one rank crashing mid-training: the run ends within a bounded time with a
non-zero exit status and the crashing rank's error in the output; no process is left hanging."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
import torch
from reliability_fixtures import TINY, train_command, train_env

pytestmark = pytest.mark.slow
TIMEOUT = 180


def process_group_ends(pgid: int, grace: float = 15.0) -> bool:
    """Whether every process of the group exits (and is reaped) within ``grace`` seconds; kills the rest."""
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    os.killpg(pgid, signal.SIGKILL)
    return False


def test_one_rank_raising_ends_the_whole_run(tmp_path):
    command = train_command(
        tmp_path, *TINY, "trainer=ddp_cpu", "trainer.max_epochs=2", "logger=csv",
        "+callbacks.raise_at_step.rank=1", "+callbacks.raise_at_step.step=1",
    )  # fmt: skip
    process = subprocess.Popen(
        command, cwd=tmp_path, env=train_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip
    start = time.monotonic()
    try:
        output, _ = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        pytest.fail(f"the DDP run hung for more than {TIMEOUT} s after rank 1 raised")
    elapsed = time.monotonic() - start
    assert process_group_ends(process.pid), "a DDP process outlived the run"
    assert process.returncode != 0
    assert "RuntimeError: planted failure on rank 1 at step 1" in output
    assert elapsed < TIMEOUT
    # One step per epoch per rank (8 images, 2 ranks, batch 4): epoch 1's checkpoint is there to resume.
    last = torch.load(tmp_path / "run/checkpoints/last.ckpt", map_location="cpu", weights_only=True)
    assert (last["epoch"], last["global_step"]) == (0, 1)
