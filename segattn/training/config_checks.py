"""train.py's checks of its composed config, before anything is built: the value schema (``config.checks``),
the dataset folder, resume and fine-tune together, and the trainer settings this machine or strategy
cannot run (FSDP's precisions, ``trainer.accelerator=gpu`` without a GPU). Each refusal names the keys and
what to set instead. The checks that need the built data module and model follow in ``preflight``."""

from __future__ import annotations

import torch
from omegaconf import DictConfig, OmegaConf

from ..config import check_data_root, check_values


def check_config(cfg: DictConfig, defaults: DictConfig | None = None) -> None:
    """Fail before training on bad values (``config.check_values``, every key typed by ``defaults`` where
    given), a missing dataset folder and settings that contradict each other, naming the keys. train.py's
    one check of its values: ``run`` calls it first, for the command line and for a direct call alike."""
    check_values(cfg, "train", defaults)
    check_data_root(cfg.data)
    if cfg.get("ckpt_path") and cfg.get("init_from"):
        raise ValueError(
            f"ckpt_path={cfg.ckpt_path} resumes a run and init_from={cfg.init_from} starts a new one "
            "from weights; set only one"
        )
    check_fsdp(cfg)
    check_accelerator(cfg)


# The CPU form of each multi-process trainer config that needs GPUs (conf/trainer/<name>.yaml).
CPU_FORMS = {"spatial": "spatial_cpu", "fsdp": "fsdp_cpu", "ddp": "ddp_cpu"}


def check_accelerator(cfg: DictConfig) -> None:
    """``trainer.accelerator=gpu`` (or cuda) on a machine without a CUDA GPU: one line naming the CPU form
    of the trainer config, where Lightning ends in "No supported gpu backend found!"."""
    accelerator = str(OmegaConf.select(cfg, "trainer.accelerator", default="auto"))
    if accelerator not in ("gpu", "cuda"):
        return
    if torch.cuda.is_available():
        return
    strategy = OmegaConf.select(cfg, "trainer.strategy")
    name = strategy.get("name") if OmegaConf.is_dict(strategy) else strategy
    hint = (
        f"trainer={CPU_FORMS[name]} is the CPU form of trainer={name}"
        if name in CPU_FORMS
        else "use trainer.accelerator=cpu (or auto)"
    )
    raise ValueError(f"trainer.accelerator={accelerator}: no CUDA GPU is available on this machine; {hint}")


# Precisions Lightning's ModelParallelStrategy (under trainer.strategy.name=fsdp) accepts.
FSDP_PRECISIONS = ("32-true", "32", "bf16-mixed", "bf16", "bf16-true", "16-true")


def check_fsdp(cfg: DictConfig) -> None:
    """``trainer.strategy.name=fsdp``: a precision the sharded strategy supports (16-mixed needs a
    gradient scaler it does not have), and no ``model.compile`` (compiling per-block-sharded models has
    not been run here). Lightning's own ``trainer.strategy=fsdp`` string is refused for ``trainer=fsdp``."""
    strategy = OmegaConf.select(cfg, "trainer.strategy")
    if isinstance(strategy, str) and strategy.startswith("fsdp"):
        raise ValueError(
            f"trainer.strategy={strategy}: Lightning's FSDP1 strategy shards the model as one unit and needs "
            "GPUs; expected trainer=fsdp (FSDP2 per block, GPUs) or trainer=fsdp_cpu (2 CPU processes)"
        )
    if not (OmegaConf.is_dict(strategy) and strategy.get("name") == "fsdp"):
        return
    precision = str(cfg.trainer.get("precision"))
    if precision not in FSDP_PRECISIONS:
        raise ValueError(
            f"trainer.precision={precision} with trainer.strategy.name=fsdp; expected one of "
            f"{', '.join(FSDP_PRECISIONS)} (bf16-mixed on GPUs)"
        )
    if OmegaConf.select(cfg, "model.compile"):
        raise ValueError(
            "model.compile=true with trainer.strategy.name=fsdp: compiling a model sharded per block has "
            "not been tested; set model.compile=false, or train with trainer=ddp to compile"
        )
