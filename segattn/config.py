"""Config plumbing for train.py and eval.py: the ``repo_root`` resolver and the checks a config must
pass before any training starts (builders check their own arguments; this covers what spans groups)."""

from __future__ import annotations

from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from .inference.infer import MODES


def repo_root() -> str:
    """The folder holding Hydra's primary ``conf/`` directory, so paths work from any working dir."""
    for source in HydraConfig.get().runtime.config_sources:
        if source.provider == "main" and source.schema == "file":
            return str(Path(source.path).resolve().parent)
    raise RuntimeError("repo_root: no file-based primary config directory in hydra.runtime.config_sources")


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
