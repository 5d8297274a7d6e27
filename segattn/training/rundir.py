"""One live run per run directory; the composed config and ``environment.json`` written into it only once the
run owns it.

Without the lock a requeued job started while the old one still runs, or a copy-pasted command with the same
``hydra.run.dir``, would train beside the first run and overwrite its config and checkpoints. The first run
holds ``<run dir>/.lock`` (pid, host, start time); a second fails at once naming the holder. A lock whose pid
is gone from this host (a killed run) is taken over; one from another host is left alone, as its process
cannot be checked from here.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import io
import json
import os
import platform
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.utilities.rank_zero import rank_zero_only

from ..files import atomic_write_text

LOCK = ".lock"
ENVIRONMENT_FILE = "environment.json"


class RunDirLockedError(FileExistsError):
    """Another live run holds this run directory."""


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host (a zombie counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def read_holder(lock: Path) -> dict:
    """The lock's holder record; an unreadable or half-written one reads as empty (treated as stale only
    when its pid can be checked, so an empty record from another host still blocks)."""
    try:
        return json.loads(lock.read_text())
    except (OSError, ValueError):
        return {}


def is_stale(holder: dict) -> bool:
    """A holder on this host whose process is gone (a killed run)."""
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    return not pid_alive(holder["pid"])


def try_create(lock: Path, record: str) -> bool:
    """Create the lock file with ``record`` if nobody has; False when it exists."""
    try:
        fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as handle:
        handle.write(record)
    return True


@contextlib.contextmanager
def run_dir_lock(run_dir: str | Path) -> Iterator[Path]:
    """Hold ``<run_dir>/.lock`` for the block; ``RunDirLockedError`` names the file and the holder's pid and
    host when a live run holds it. Creates ``run_dir`` if needed and removes it again if the run leaves it
    empty (it failed its checks)."""
    run_dir = Path(run_dir)
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = run_dir / LOCK
    record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()})
    if not try_create(lock, record):
        holder = read_holder(lock)
        if not is_stale(holder):
            raise RunDirLockedError(
                f"run dir {run_dir} is in use by another run: {lock} is held by pid {holder.get('pid', '?')} "
                f"on host {holder.get('host', '?')}; wait for it to end, use another hydra.run.dir, or "
                "delete the lock file if that run is gone"
            )
        lock.unlink(missing_ok=True)  # a killed run's lock: take it over
        if not try_create(lock, record):  # another starter took it over first
            holder = read_holder(lock)
            raise RunDirLockedError(
                f"run dir {run_dir} was just taken by pid {holder.get('pid', '?')} on host "
                f"{holder.get('host', '?')} ({lock})"
            )
    try:
        yield lock
    finally:
        if read_holder(lock).get("pid") == os.getpid():
            lock.unlink(missing_ok=True)
        if created and not any(run_dir.iterdir()):
            run_dir.rmdir()


def claim_run_dir(run_dir: str | Path) -> contextlib.AbstractContextManager:
    """The run-dir lock for the process of global rank zero; DDP ranks it started (or torchrun / SLURM
    started beside it) share the directory and take no lock."""
    return run_dir_lock(run_dir) if rank_zero_only.rank == 0 else contextlib.nullcontext()


@functools.cache
def environment() -> dict[str, str]:
    """The versions a run and its checkpoints' records name: segattn and timm as installed, torch as built
    (``torch.__version__``, with its CUDA tag), Python, and the git commit of segattn's code ("unknown"
    where it is not a git checkout or git is missing; never fails)."""
    import torch

    # str(): torch.__version__ is a TorchVersion, which a weights_only checkpoint load refuses to unpickle
    versions = {"segattn": "unknown", "torch": str(torch.__version__), "timm": "unknown"}
    for name in ("segattn", "timm"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[name] = importlib.metadata.version(name)
    return {**versions, "python": platform.python_version(), "git_commit": git_commit()}


def git_commit() -> str:
    """HEAD of the git checkout holding this package, or "unknown": an installed copy (also one inside a
    user's own repository, where the package's files are not tracked) names no commit."""
    package = Path(__file__).resolve().parent
    commands = (["git", "ls-files", "--error-unmatch", Path(__file__).name], ["git", "rev-parse", "HEAD"])
    output = ""
    for command in commands:
        try:
            done = subprocess.run(command, cwd=package, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return "unknown"
        if done.returncode != 0:
            return "unknown"
        output = done.stdout.strip()
    return output or "unknown"


def save_environment(run_dir: str | Path) -> None:
    """Write ``<run dir>/environment.json``: ``environment()``, as its checkpoints' records name it."""
    atomic_write_text(Path(run_dir) / ENVIRONMENT_FILE, json.dumps(environment(), indent=2) + "\n")


# The groups a reader looks for first, in this order; the other keys follow as composed.
TREE_ORDER = ("data", "model", "attention", "loss", "optimizer", "scheduler", "trainer", "inference")


def config_tree(cfg: DictConfig) -> str:
    """The composed config as a tree, as the lightning-hydra-template prints it: a branch per top-level key,
    ``TREE_ORDER`` first, values resolved where they can be."""
    from rich.console import Console
    from rich.syntax import Syntax
    from rich.tree import Tree

    tree = Tree("config", guide_style="dim")
    keys = [k for k in TREE_ORDER if k in cfg] + [k for k in cfg if k not in TREE_ORDER]
    for key in keys:
        node = cfg._get_node(key)
        try:
            value = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else cfg[key]
        except Exception:  # an interpolation only Hydra's runtime resolves: shown as written
            value = OmegaConf.to_container(node) if OmegaConf.is_config(node) else node._value()
        if isinstance(value, dict | list):
            tree.add(key).add(Syntax(OmegaConf.to_yaml(OmegaConf.create(value)).rstrip(), "yaml"))
        else:
            tree.add(f"{key}: {value}")
    console = Console(file=io.StringIO(), width=110, color_system=None)
    console.print(tree)
    return "".join(line.rstrip() + "\n" for line in console.file.getvalue().splitlines())


def save_run_config(cfg: DictConfig, run_dir: str | Path) -> None:
    """Write ``.hydra/config.yaml``, ``hydra.yaml`` and ``overrides.yaml`` as Hydra would (it is told not to:
    ``hydra.output_subdir: null``), called once the run owns its directory and passed every check; print the
    config tree and keep it as ``config_tree.txt``."""
    folder = Path(run_dir) / ".hydra"
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder / "config.yaml", OmegaConf.to_yaml(cfg))
    tree = config_tree(cfg)
    print(tree, end="")
    atomic_write_text(Path(run_dir) / "config_tree.txt", tree)
    if HydraConfig.initialized():
        hydra_cfg = HydraConfig.get()
        atomic_write_text(folder / "hydra.yaml", OmegaConf.to_yaml(OmegaConf.create({"hydra": hydra_cfg})))
        atomic_write_text(folder / "overrides.yaml", OmegaConf.to_yaml(hydra_cfg.overrides.task))
