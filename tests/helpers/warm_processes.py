"""``python train.py ...`` as a new process without paying the imports again: forked from a fork server that
has imported torch, Lightning and segattn once per test worker.

A train.py process spends seconds of CPU importing torch, Lightning (with torchmetrics, torchvision and
scipy) and timm before it reads its first override; the tests that need a real process (a signal, a kill, a
crash, exit statuses, the job logging) ran dozens of them. Here the command runs in a child of
multiprocessing's fork server, whose preloaded modules are these imports: the child sets its arguments,
working directory, environment and standard streams as ``subprocess.Popen`` would, runs the script as
``__main__``, and ends as the interpreter does (non-daemon threads joined, its exit handlers run, exit
status of ``SystemExit``, 1 and a traceback for an uncaught exception, death by SIGINT for an uncaught
KeyboardInterrupt). What the server's imports made (W&B's media folder) and will clean up at exit stays
the server's. ``WarmProcess`` answers like a ``Popen``.

What a fork cannot give as a fresh interpreter would falls back to ``subprocess.Popen``: a command that is
not ``python <script> ...`` (``-m``: runpy warns of a module the server has imported), and an environment
whose variables read at import time (``IMPORT_TIME``) differ from the server's. The tests of the installed
commands, of the documented command lines and of export end to end keep fresh interpreters on purpose. A
plain module (not conftest.py) so that the fork server can import it by name.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing as mp
import multiprocessing.util as mp_util
import os
import random
import runpy
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import torch

import segattn.cli  # the preload: train.py's and eval.py's imports
import segattn.training.run  # noqa: F401

# Read once when a module is imported (huggingface_hub's offline flag, Triton's interpreter, thread pools,
# the hash seed), so a child cannot take them from its own environment: a command asking for another value
# of one of them than the server started with gets a fresh interpreter.
IMPORT_TIME = ("HF_HUB_OFFLINE", "TRITON_INTERPRET", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONHASHSEED")
HELPERS = str(Path(__file__).resolve().parent)
PRELOAD = ["warm_processes", "band_workers"]  # band_workers: the fork server of the band-parallel worlds
_server_env: dict[str, str | None] | None = None


def forkserver() -> Any:
    """multiprocessing's fork-server context, its server started (once per process) with PRELOAD imported,
    in this process's environment (tests/conftest.py makes it offline)."""
    global _server_env
    context = mp.get_context("forkserver")
    if _server_env is None:
        context.set_forkserver_preload(PRELOAD)
        # The server imports PRELOAD by name before it reads the caller's sys.path (Python 3.11): this folder
        # goes on its PYTHONPATH, or every import fails quietly and each child pays them again.
        path = os.pathsep.join(part for part in (HELPERS, os.environ.get("PYTHONPATH")) if part)
        saved = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = path
        try:
            from multiprocessing import forkserver as server

            server.ensure_running()
        finally:
            if saved is None:
                del os.environ["PYTHONPATH"]
            else:
                os.environ["PYTHONPATH"] = saved
        _server_env = {key: os.environ.get(key) for key in IMPORT_TIME}
    return context


def server_environment() -> dict[str, str | None]:
    """The server's values of the variables read at import (``IMPORT_TIME``; None: unset): a command whose
    environment has the same runs forked."""
    forkserver()
    assert _server_env is not None
    return dict(_server_env)


def _streams(stdout: str | None, stderr: str | None) -> None:
    """Point fds 1 and 2 (and sys.stdout, sys.stderr) at the given files; ``stderr`` None: the same as
    stdout (``stderr=subprocess.STDOUT``)."""
    out = os.open(stdout or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(out, 1)
    os.dup2(os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) if stderr else out, 2)
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.stdout = open(1, "w", closefd=False, buffering=1 if unbuffered else -1)  # noqa: SIM115
    sys.stderr = open(2, "w", closefd=False, buffering=1)  # noqa: SIM115  (stderr is line-buffered)


def _exit_code(error: SystemExit) -> int:
    """The status the interpreter gives an uncaught SystemExit."""
    if error.code is None:
        return 0
    if isinstance(error.code, int):
        return error.code
    print(error.code, file=sys.stderr)
    return 1


def _run_in_child(
    target: list[str], cwd: str, env: dict[str, str], stdout: str | None, stderr: str | None, session: bool
) -> None:
    """The child: become the command's process, run it, end as the interpreter would (``os._exit``)."""
    if session:
        os.setsid()
    # The default start method again (fork, not the server's), so that its loader workers fork from it as
    # they would from a fresh interpreter; and that interpreter's process name.
    mp.set_start_method(None, force=True)
    mp.current_process().name = "MainProcess"
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    _streams(stdout, stderr)
    sys.path[:0] = [part for part in env.get("PYTHONPATH", "").split(os.pathsep) if part]
    # What the server's imports clean up at exit (W&B's media folder, made when imported) stays the
    # server's: a child that ran those exit handlers and finalizers would delete it under every other
    # child. Kept: the standard library's handlers for what the child makes (log files, child processes).
    atexit._clear()  # type: ignore[attr-defined]
    atexit.register(logging.shutdown)
    atexit.register(mp_util._exit_function)  # type: ignore[attr-defined]
    for finalizer in list(weakref.finalize._registry):  # type: ignore[attr-defined]
        finalizer.detach()
    random.seed()  # a fresh interpreter's seeds, not the server's state shared by every fork
    np.random.seed()
    torch.seed()
    code, interrupted = 0, False
    try:
        sys.argv = list(target)
        sys.path.insert(0, str(Path(target[0]).resolve().parent))
        runpy.run_path(target[0], run_name="__main__")
    except SystemExit as error:
        code = _exit_code(error)
    except KeyboardInterrupt:
        traceback.print_exc()
        code, interrupted = 130, True
    except BaseException:
        traceback.print_exc()
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]  (what Py_Finalize does first)
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    if interrupted:  # as CPython: an uncaught KeyboardInterrupt ends the process by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


class WarmProcess:
    """A forked command, answering like ``subprocess.Popen`` (text mode): ``pid``, ``returncode``
    (negative: killed by that signal), ``poll``, ``wait``, ``communicate``, ``send_signal``, ``kill``."""

    def __init__(self, args: list[str], process: Any, capture: Path, piped: tuple[bool, bool]) -> None:
        self.args, self._process, self._capture, self._piped = args, process, capture, piped
        self.pid: int = process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self._process.exitcode

    def communicate(self, timeout: float | None = None) -> tuple[str | None, str | None]:
        self.wait(timeout)
        stdout, stderr = (
            ((self._capture / name).read_text(errors="replace") if (self._capture / name).exists() else "")
            if piped
            else None
            for name, piped in zip(("stdout", "stderr"), self._piped, strict=True)
        )
        shutil.rmtree(self._capture, ignore_errors=True)
        return stdout, stderr

    def send_signal(self, number: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, number)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


Job = WarmProcess | subprocess.Popen  # what ``start`` returns


def _warm_target(command: list[str], env: dict[str, str]) -> list[str] | None:
    """The script and its arguments when ``command`` (``python <script> ...``) can run forked, else None."""
    if len(command) < 2 or command[0] != sys.executable or command[1].startswith("-"):
        return None
    server = server_environment()
    if any(env.get(key) != server[key] for key in IMPORT_TIME):
        return None
    return command[1:]


def start(
    command: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    stdout: int | Path = subprocess.PIPE,
    stderr: int | Path = subprocess.PIPE,
    start_new_session: bool = False,
) -> Job:
    """Start ``command`` (``[sys.executable, script, args...]``) forked from the warm server, or
    as ``subprocess.Popen`` where a fork would not be a fresh interpreter's equal. ``stdout`` and ``stderr``:
    ``subprocess.PIPE`` (read back by ``communicate``), a file path, or for stderr ``subprocess.STDOUT``."""
    target = _warm_target(command, env)
    if target is None:
        with contextlib.ExitStack() as files:  # the child holds its own copies of the files
            out, err = (
                files.enter_context(stream.open("w")) if isinstance(stream, Path) else stream
                for stream in (stdout, stderr)
            )
            return subprocess.Popen(
                command, cwd=cwd, env=env, stdout=out, stderr=err, text=True,
                start_new_session=start_new_session,
            )  # fmt: skip
    capture = Path(tempfile.mkdtemp(prefix="segattn-warm-"))  # not in cwd: tests list what a run leaves there
    out = stdout if isinstance(stdout, Path) else capture / "stdout" if stdout == subprocess.PIPE else None
    err = None if stderr == subprocess.STDOUT else stderr if isinstance(stderr, Path) else capture / "stderr"
    process = forkserver().Process(
        target=_run_in_child,
        args=(target, str(cwd), dict(env), out and str(out), err and str(err), start_new_session),
    )
    process.start()
    return WarmProcess(command, process, capture, (stdout == subprocess.PIPE, stderr == subprocess.PIPE))


def run(command: list[str], *, cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """``subprocess.run(command, capture_output=True, text=True, timeout=...)`` through ``start``."""
    job = start(command, cwd=cwd, env=env)
    try:
        stdout, stderr = job.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        job.kill()
        job.wait()
        raise
    return subprocess.CompletedProcess(command, job.returncode, stdout, stderr)
