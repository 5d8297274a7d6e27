"""The resolvers conf/'s files use (``${repo_root:}``, ``${workers:N}``), and a config node as plain values
(``plain``): what every command needs from OmegaConf before and after Hydra composes."""

from __future__ import annotations

import os
from typing import Any

from omegaconf import OmegaConf

from ..files import source_checkout


def repo_root() -> str:
    """``paths.root_dir``: the checkout, so its ``data/`` and ``outputs/`` are used from any working
    directory; for an installed package (no checkout), the working directory."""
    checkout = source_checkout()
    return str(checkout) if checkout else os.getcwd()


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity: a job's or container's share of the machine),
    as torch's DataLoader counts them when it warns about too many workers."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no sched_getaffinity (macOS, Windows)
        return os.cpu_count() or 1


def workers(at_most: int) -> int:
    """``${workers:N}``, the data configs' default ``num_workers``: N loader processes, but never more than
    the cores available (4 on a 2-core machine would be 2 processes per core, which torch warns about)."""
    return min(int(at_most), available_cores())


def register_resolvers() -> None:
    """Make ``${repo_root:}`` and ``${workers:N}`` available to configs; call before Hydra composes
    (idempotent)."""
    if not OmegaConf.has_resolver("repo_root"):
        OmegaConf.register_new_resolver("repo_root", repo_root)
    if not OmegaConf.has_resolver("workers"):
        OmegaConf.register_new_resolver("workers", workers)


def plain(node: Any) -> Any:
    """A config node as plain Python containers, interpolations resolved (``???`` left as is); any other
    value as it is. How a command hands a config group to the builders, which never see the config tree."""
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
