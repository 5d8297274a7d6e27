"""The warm processes of the tests (tests/helpers/warm_processes.py) behave as fresh interpreters do: the same
exit status, standard streams, working directory, environment and signal deaths as ``subprocess`` for the
same script, with the server's imports already done; a command the fork server cannot run as a fresh
interpreter would gets one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from warm_processes import WarmProcess, server_environment, start

SCRIPT = """
import atexit, multiprocessing, os, signal, sys, threading, time
print("cwd", os.getcwd(), "env", os.environ.get("WARM_TEST"), "argv", sys.argv[1:])
print("start method", multiprocessing.get_start_method(allow_none=True), file=sys.stderr)
print("preloaded", "pytorch_lightning" in sys.modules, file=sys.stderr)
threading.Thread(target=lambda: (time.sleep(0.2), print("thread joined"))).start()
atexit.register(lambda: print("atexit ran"))
mode = sys.argv[1]
if mode == "exit":
    sys.exit(3)
if mode == "message":
    sys.exit("a message")
if mode == "raise":
    raise RuntimeError("planted")
if mode == "interrupt":
    raise KeyboardInterrupt
if mode == "sigterm":
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
"""


@pytest.fixture(scope="module")
def script(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("warm") / "script.py"
    path.write_text(SCRIPT)
    return path


def environment() -> dict[str, str]:
    """The worker's environment with the server's values of the variables read at import, plus one of ours
    (a test that ran earlier in this process may have set one of them since the server started)."""
    env = {**os.environ, "WARM_TEST": "seen"}
    for key, value in server_environment().items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


@pytest.mark.parametrize("mode", ["ok", "exit", "message", "raise", "interrupt", "sigterm"])
def test_a_warm_process_ends_as_a_fresh_interpreter_does(script, tmp_path, mode):
    command = [sys.executable, str(script), mode]
    job = start(command, cwd=tmp_path, env=environment())
    assert isinstance(job, WarmProcess)  # forked, not started fresh
    warm = subprocess.CompletedProcess(command, job.wait(timeout=120), *job.communicate())
    fresh = subprocess.run(command, cwd=tmp_path, env=environment(), capture_output=True, text=True)
    assert (warm.returncode, warm.stdout) == (fresh.returncode, fresh.stdout)
    last_line = lambda text: [line for line in text.splitlines() if not line.startswith("preloaded")][-1]
    assert last_line(warm.stderr) == last_line(fresh.stderr)  # the traceback's or the message's
    assert "start method None" in warm.stderr  # its loader workers fork from it, as from a fresh interpreter
    assert "preloaded True" in warm.stderr  # the server's imports, not paid again
    assert f"cwd {tmp_path} env seen argv ['{mode}']" in warm.stdout


def test_an_import_time_variable_the_server_lacks_gets_a_fresh_interpreter(script, tmp_path):
    env = environment() | {"PYTHONHASHSEED": "7" if os.environ.get("PYTHONHASHSEED") != "7" else "8"}
    job = start([sys.executable, str(script), "ok"], cwd=tmp_path, env=env)
    assert isinstance(job, subprocess.Popen)
    assert job.communicate(timeout=120)[0].startswith(f"cwd {tmp_path}")


def test_what_the_server_imported_outlives_a_child(tmp_path):
    """W&B makes its media folder when imported, in the server: one child's exit must not delete it."""
    script = tmp_path / "media.py"
    script.write_text(
        "import os\nfrom wandb.sdk.data_types._private import MEDIA_TMP\n"
        "open(os.path.join(MEDIA_TMP.name, f'{os.getpid()}.png'), 'w').close()\n"
    )
    for _ in range(2):
        job = start([sys.executable, str(script)], cwd=tmp_path, env=environment())
        assert isinstance(job, WarmProcess) and job.wait(timeout=120) == 0, job.communicate()[1]


def test_a_module_or_code_command_gets_a_fresh_interpreter(tmp_path):
    job = start([sys.executable, "-c", "print('fresh')"], cwd=tmp_path, env=environment())
    assert isinstance(job, subprocess.Popen)
    assert job.communicate(timeout=120)[0] == "fresh\n"


def test_a_new_session_is_its_own_process_group(tmp_path):
    sleeper = tmp_path / "sleep.py"
    sleeper.write_text("import os, time\nprint(os.getpgid(0), flush=True)\ntime.sleep(60)\n")
    out = tmp_path / "out.txt"
    job = start(
        [sys.executable, str(sleeper)], cwd=tmp_path, env=environment(), stdout=out, start_new_session=True
    )
    assert isinstance(job, WarmProcess)
    deadline = time.monotonic() + 60
    while not (out.exists() and out.read_text()):
        assert job.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    assert int(out.read_text()) == job.pid
    os.killpg(job.pid, signal.SIGKILL)
    assert job.wait(timeout=30) == -signal.SIGKILL
