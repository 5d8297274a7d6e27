"""Config plumbing for every command: where ``conf/`` is, the ``repo_root`` resolver, and the checks a
config must pass before anything starts (builders check their own arguments; these span groups)."""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from .inference.tiling import MODES


def source_checkout() -> Path | None:
    """The repository this package runs from (an editable install or a checkout), if any."""
    root = Path(__file__).resolve().parents[1]
    return root if (root / "pyproject.toml").is_file() and (root / "conf").is_dir() else None


def config_dir() -> Path:
    """``conf/``: the checkout's top-level folder, or the copy a non-editable install ships in the package."""
    checkout = source_checkout()
    return checkout / "conf" if checkout else Path(__file__).resolve().parent / "conf"


def repo_root() -> str:
    """``paths.root_dir``: the checkout, so its ``data/`` and ``outputs/`` are used from any working
    directory; for an installed package (no checkout), the working directory."""
    checkout = source_checkout()
    return str(checkout) if checkout else os.getcwd()


def register_resolvers() -> None:
    """Make ``${repo_root:}`` available to configs; call before Hydra composes (idempotent)."""
    if not OmegaConf.has_resolver("repo_root"):
        OmegaConf.register_new_resolver("repo_root", repo_root)


def check_config(cfg: DictConfig) -> None:
    """Fail before training on settings that contradict each other, naming the keys."""
    if cfg.get("ckpt_path") and cfg.get("init_from"):
        raise ValueError(
            f"ckpt_path={cfg.ckpt_path} resumes a run and init_from={cfg.init_from} starts a new one "
            "from weights; set only one"
        )
    check_validation(cfg.validation)


def check_validation(validation: DictConfig) -> None:
    """``validation.*`` (train, test and eval): a known mode, and a window for slide mode."""
    if validation.mode not in MODES:
        raise ValueError(f"validation.mode={validation.mode!r}; expected one of {', '.join(MODES)}")
    if validation.mode == "slide" and not validation.crop_size:
        raise ValueError(
            "validation.mode=slide needs validation.crop_size (and optionally validation.stride)"
        )
