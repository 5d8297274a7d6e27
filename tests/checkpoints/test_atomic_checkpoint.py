"""Checkpoint writes are atomic: a crash or a ``kill -9`` in the middle of a save leaves the previous
checkpoint intact and loadable, and training writes every checkpoint through AtomicCheckpointIO."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from reliability_fixtures import TINY, compose_run

from segattn.checkpoints.atomic import atomic_save
from segattn.errors import DiskError
from segattn.files import temp_files
from segattn.training.checkpointing import AtomicCheckpointIO
from segattn.training.run import build_trainer, run

# A child that overwrites ckpt with new tensors through atomic_save, but whose serializer writes half the
# bytes, signals the test, and stalls: the test kills it there with SIGKILL.
HALF_WRITTEN_SAVE = """
import io, sys, time, pathlib, torch
from segattn.checkpoints.atomic import atomic_save
path, marker = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
real_save = torch.save
def half_then_stall(obj, handle):
    buffer = io.BytesIO()
    real_save(obj, buffer)
    data = buffer.getvalue()
    handle.write(data[: len(data) // 2])
    handle.flush()
    marker.with_name("partial").write_text(str(len(data)))
    marker.with_name("partial").replace(marker)  # by rename: the test never reads an empty marker
    time.sleep(120)
torch.save = half_then_stall
atomic_save({"weights": torch.full((4096,), 2.0), "step": 2}, path)
"""


def old_checkpoint(path):
    atomic_save({"weights": torch.ones(4096), "step": 1}, path)
    return path.read_bytes()


@pytest.mark.slow
def test_kill_9_during_save_leaves_the_old_checkpoint(tmp_path):
    path, marker = tmp_path / "last.ckpt", tmp_path / "writing"
    before = old_checkpoint(path)
    child = subprocess.Popen([sys.executable, "-c", HALF_WRITTEN_SAVE, str(path), str(marker)])
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert child.poll() is None and time.monotonic() < deadline, "the child never started writing"
        time.sleep(0.02)
    os.kill(child.pid, signal.SIGKILL)
    assert child.wait(timeout=30) == -signal.SIGKILL

    assert path.read_bytes() == before  # the target was never touched
    restored = torch.load(path, map_location="cpu", weights_only=True)
    assert restored["step"] == 1 and torch.equal(restored["weights"], torch.ones(4096))
    (partial,) = temp_files(path)  # the half-written file is a hidden temp file next to it
    assert partial.name.startswith(".last.ckpt.") and partial.suffix == ".tmp"
    assert 0 < partial.stat().st_size < int(marker.read_text())
    atomic_save({"weights": torch.zeros(1), "step": 3}, path)  # the next save cleans it up
    assert temp_files(path) == [] and torch.load(path, weights_only=True)["step"] == 3


def test_serializer_error_mid_write_keeps_old_file_and_leaves_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "best.ckpt"
    before = old_checkpoint(path)

    def fail_half_way(obj, handle):
        handle.write(b"PK\x03\x04 partial zip")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", fail_half_way)
    with pytest.raises(DiskError, match=f"^no space left on {tmp_path}: writing best.ckpt"):  # an OSError
        AtomicCheckpointIO().save_checkpoint({"step": 2}, path)
    assert path.read_bytes() == before and temp_files(path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.ckpt"]


def test_new_file_is_complete_and_has_default_permissions(tmp_path):
    path = tmp_path / "sub" / "epoch=1.ckpt"  # missing folders are created
    AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.arange(3.0)}}, path)
    loaded = AtomicCheckpointIO().load_checkpoint(path, weights_only=True)
    assert torch.equal(loaded["state_dict"]["w"], torch.tensor([0.0, 1.0, 2.0]))
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # like open(), not mkstemp's 0600


@pytest.mark.parametrize("trainer", ["cpu", "ddp_cpu", "fsdp_cpu"])
def test_training_writes_checkpoints_through_atomic_io(tmp_path, trainer):
    cfg = compose_run(tmp_path, *TINY, f"trainer={trainer}", "logger=none")
    assert isinstance(build_trainer(cfg, [], []).strategy.checkpoint_io, AtomicCheckpointIO)


def test_last_ckpt_follows_every_epoch_even_without_improvement(tmp_path):
    # lr=0: weights never change, so val/mIoU never improves after epoch 1 and no best.ckpt is saved again;
    # stock Lightning >= 2.5 would then leave last.ckpt at epoch 1 and ckpt_path=last would lose 2 epochs.
    cfg = compose_run(tmp_path, *TINY, "trainer.max_epochs=3", "optimizer.lr=0", "logger=none")
    run(cfg)
    checkpoints = tmp_path / "run" / "checkpoints"
    best = torch.load(checkpoints / "best.ckpt", map_location="cpu", weights_only=True)
    last = torch.load(checkpoints / "last.ckpt", map_location="cpu", weights_only=True)
    assert best["global_step"] == 2 and last["global_step"] == 6 and last["epoch"] == 2
    assert sorted(path.name for path in checkpoints.iterdir()) == ["best.ckpt", "last.ckpt"]
