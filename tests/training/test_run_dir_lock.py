"""One live run per run directory: a second run fails at once naming the lock file and its holder, and
leaves the first run's files alone; the lock of a killed run is taken over."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest
from reliability_fixtures import TINY

from segattn import cli
from segattn.training.rundir import LOCK, RunDirLockedError, run_dir_lock


def write_lock(run_dir, pid: int, host: str | None = None) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / LOCK).write_text(json.dumps({"pid": pid, "host": host or socket.gethostname(), "started": 0}))


@pytest.fixture
def live_pid():
    """The pid of a process that stays alive for the test (another run holding the directory)."""
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield holder.pid
    holder.kill()
    holder.wait()


def dead_pid() -> int:
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    return finished.pid


def test_a_live_holder_blocks_and_is_named(tmp_path, live_pid):
    write_lock(tmp_path / "run", live_pid)
    with pytest.raises(RunDirLockedError) as error, run_dir_lock(tmp_path / "run"):
        pass
    message = str(error.value)
    assert str(tmp_path / "run" / LOCK) in message
    assert f"pid {live_pid} on host {socket.gethostname()}" in message
    assert json.loads((tmp_path / "run" / LOCK).read_text())["pid"] == live_pid  # untouched


def test_a_lock_from_another_host_is_never_taken_over(tmp_path):
    write_lock(tmp_path / "run", dead_pid(), host="some-other-node")
    with pytest.raises(RunDirLockedError, match="on host some-other-node"), run_dir_lock(tmp_path / "run"):
        pass


def test_a_killed_runs_lock_is_taken_over_and_released(tmp_path):
    write_lock(tmp_path / "run", dead_pid())
    with run_dir_lock(tmp_path / "run") as lock:
        assert json.loads(lock.read_text())["pid"] == os.getpid()
        with pytest.raises(RunDirLockedError), run_dir_lock(tmp_path / "run"):  # held: no second holder
            pass
    assert not lock.exists()


def test_a_second_train_py_in_a_held_run_dir_fails_at_once(tmp_path, live_pid, monkeypatch, capsys):
    """train.py's Hydra app, in-process: the second run exits 1 with one line naming the lock and its
    holder, before writing anything into the first run's directory."""
    run_dir = tmp_path / "job42"
    write_lock(run_dir, live_pid)
    (run_dir / ".hydra").mkdir()
    (run_dir / ".hydra" / "config.yaml").write_text("the first run's config\n")
    argv = [f"paths.log_dir={tmp_path}", f"hydra.run.dir={run_dir}", "hydra/job_logging=none", *TINY]
    monkeypatch.setattr(sys, "argv", ["train.py", *argv, "logger=none"])
    started = time.monotonic()
    with pytest.raises(SystemExit) as ended:
        cli.train()
    assert ended.value.code == 1 and time.monotonic() - started < 30
    assert capsys.readouterr().err.strip().splitlines() == [
        f"train.py: run dir {run_dir} is in use by another run: {run_dir / LOCK} is held by pid "
        f"{live_pid} on host {socket.gethostname()}; wait for it to end, use another hydra.run.dir, or "
        "delete the lock file if that run is gone"
    ]
    assert (run_dir / ".hydra" / "config.yaml").read_text() == "the first run's config\n"
    assert sorted(path.name for path in run_dir.iterdir()) == [".hydra", LOCK]
