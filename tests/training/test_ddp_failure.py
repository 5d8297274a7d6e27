"""``trainer=ddp_cpu`` with faults on one rank: a NaN batch there is skipped by both ranks (the guard's
decision and file report cross ranks), and a crash there ends the run within a bounded time with a
non-zero exit status and that rank's error in the output; no process is left hanging."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
import torch
from reliability_fixtures import TINY, start_train

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


def test_nan_then_crash_on_one_rank(tmp_path):
    # One step per epoch per rank (8 images, 2 ranks, batch 4): step 0 NaN on rank 1, step 1 fine,
    # rank 1 raises at step 2.
    record = tmp_path / "poisoned.txt"
    process = start_train(
        tmp_path, *TINY, "trainer=ddp_cpu", "trainer.max_epochs=4", "logger=csv",
        "+callbacks.poison_batch._target_=fault_callbacks.PoisonBatch",
        "+callbacks.poison_batch.rank=1", "+callbacks.poison_batch.step=0",
        f"+callbacks.poison_batch.record={record}",
        "+callbacks.raise_at_step._target_=fault_callbacks.RaiseAtStep",
        "+callbacks.raise_at_step.rank=1", "+callbacks.raise_at_step.step=2",
        stderr=subprocess.STDOUT, new_session=True,
    )  # fmt: skip
    start = time.monotonic()
    try:
        output, _ = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        pytest.fail(f"the DDP run hung for more than {TIMEOUT} s")
    elapsed = time.monotonic() - start
    assert process_group_ends(process.pid), "a DDP process outlived the run"
    assert process.returncode != 0
    assert "RuntimeError: planted failure on rank 1 at step 2" in output
    assert elapsed < TIMEOUT
    # The NaN: reported once (rank zero), naming rank 1's files only, and skipped on both ranks.
    files = record.read_text()
    assert output.count("non-finite loss at step 0") == 1
    assert f"non-finite loss at step 0 (epoch 0); batch files: {files}: skipped" in output
    # Epoch 2's checkpoint is there to resume from: 2 steps taken, the optimizer applied only 1.
    last = torch.load(tmp_path / "run/checkpoints/last.ckpt", map_location="cpu", weights_only=True)
    assert (last["epoch"], last["global_step"]) == (1, 2)
    assert {int(state["step"]) for state in last["optimizer_states"][0]["state"].values()} == {1}
    assert all(torch.isfinite(t).all() for t in last["state_dict"].values() if t.is_floating_point())
