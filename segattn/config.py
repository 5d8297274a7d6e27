"""Config plumbing for every command: where ``conf/`` is, the ``repo_root`` resolver, and the checks a
config must pass before anything starts: the types and ranges of the values users set (``VALUE_RULES``),
required keys and paths, and settings that span groups. Builders check their own arguments (model and
attention options, dataset names); what is checked here fails before any run dir content, logger or
trainer exists, with one line per bad key naming the key, the value and what was expected."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from .inference.tiling import MODES

PRECISIONS = (
    "64-true",
    "32-true",
    "16-mixed",
    "bf16-mixed",
    "16-true",
    "bf16-true",
    "64",
    "32",
    "16",
    "bf16",
)


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


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return (is_int(value) or isinstance(value, float)) and math.isfinite(value)


def int_at_least(low: int) -> Callable[[Any], bool]:
    return lambda value: is_int(value) and value >= low


def positive_size(value: Any) -> bool:
    """A side or an [H, W] pair of positive integers."""
    sides = value if isinstance(value, list) else [value]
    return len(sides) in (1, 2) and all(is_int(side) and side > 0 for side in sides)


def optional_size(value: Any) -> bool:
    return value is None or positive_size(value)


def batch_limit(value: Any) -> bool:
    """Lightning's ``limit_*_batches``: null, a batch count, or a fraction in [0, 1]."""
    return value is None or (is_int(value) and value >= 0) or (isinstance(value, float) and 0 <= value <= 1)


EXPORT_FORMATS = ("onnx", "torchscript", "safetensors")  # segattn.export.command.FORMATS
# key: (what is expected, check). A key absent from the composed config (another command) is skipped.
VALUE_RULES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "seed": ("an integer", is_int),
    "trainer.max_epochs": (
        "an integer >= -1 (-1: no limit) or null",
        lambda v: v is None or int_at_least(-1)(v),
    ),
    "trainer.max_steps": ("an integer >= -1 (-1: no limit)", int_at_least(-1)),
    "trainer.devices": (
        "a count >= 1, -1 (all), a list of device ids or 'auto'",
        lambda v: (
            int_at_least(1)(v)
            or v == -1
            or v == "auto"
            or (isinstance(v, list) and all(is_int(i) for i in v))
            or (isinstance(v, str) and v.replace(",", "").isdigit())
        ),
    ),
    "trainer.num_nodes": ("an integer >= 1", int_at_least(1)),
    "trainer.precision": (f"one of {', '.join(PRECISIONS)}", lambda v: str(v) in PRECISIONS),
    "trainer.log_every_n_steps": ("an integer >= 1", int_at_least(1)),
    "trainer.accumulate_grad_batches": ("an integer >= 1", int_at_least(1)),
    "trainer.check_val_every_n_epoch": ("an integer >= 1 or null", lambda v: v is None or int_at_least(1)(v)),
    "trainer.num_sanity_val_steps": ("an integer >= -1 (-1: all)", int_at_least(-1)),
    "trainer.gradient_clip_val": ("a number >= 0 or null", lambda v: v is None or (is_number(v) and v >= 0)),
    "trainer.limit_train_batches": ("null, a batch count >= 0 or a fraction in [0, 1]", batch_limit),
    "trainer.limit_val_batches": ("null, a batch count >= 0 or a fraction in [0, 1]", batch_limit),
    "trainer.deterministic": ("true, false or 'warn'", lambda v: isinstance(v, bool) or v == "warn"),
    "data.batch_size": ("an integer >= 1", int_at_least(1)),
    "data.val_batch_size": ("an integer >= 1", int_at_least(1)),
    "data.num_workers": ("an integer >= 0", int_at_least(0)),
    "data.crop_size": ("a positive size: H or [H, W] in pixels", positive_size),
    "data.image_size": ("a positive size: H or [H, W] in pixels", positive_size),
    "data.window_size": ("a positive size: H or [H, W] in pixels", positive_size),
    "data.windows_per_split": ("an integer >= 1", int_at_least(1)),
    "data.ratio_range": (
        "[low, high] with 0 < low <= high",
        lambda v: isinstance(v, list) and len(v) == 2 and all(is_number(x) for x in v) and 0 < v[0] <= v[1],
    ),
    "data.hflip": ("a probability in [0, 1]", lambda v: is_number(v) and 0 <= v <= 1),
    "data.mean": (
        "3 numbers (RGB, 0..1 scale)",
        lambda v: isinstance(v, list) and len(v) == 3 and all(is_number(x) for x in v),
    ),
    "data.std": (
        "3 positive numbers (RGB, 0..1 scale)",
        lambda v: isinstance(v, list) and len(v) == 3 and all(is_number(x) and x > 0 for x in v),
    ),
    "optimizer.lr": ("a number >= 0", lambda v: is_number(v) and v >= 0),
    "optimizer.weight_decay": ("a number >= 0", lambda v: is_number(v) and v >= 0),
    "optimizer.eps": ("a number > 0", lambda v: is_number(v) and v > 0),
    "scheduler.warmup_steps": ("an integer >= 0", int_at_least(0)),
    "validation.crop_batch_size": ("an integer >= 1", int_at_least(1)),
    "validation.crop_size": ("null or a positive size: H or [H, W] in pixels", optional_size),
    "validation.stride": ("null or a positive size: H or [H, W] in pixels", optional_size),
    "validation.scales": (
        "a non-empty list of numbers > 0",
        lambda v: isinstance(v, list) and bool(v) and all(is_number(x) and x > 0 for x in v),
    ),
    "num_examples": ("an integer >= 0", int_at_least(0)),
    "crop_batch_size": ("an integer >= 1", int_at_least(1)),
    "alpha": ("an opacity in [0, 1]", lambda v: is_number(v) and 0 <= v <= 1),
    "stream": ("true or false", lambda v: isinstance(v, bool)),
    "opset": ("an ONNX opset, an integer >= 17", int_at_least(17)),
    "height": ("an integer >= 1 (pixels)", int_at_least(1)),
    "width": ("an integer >= 1 (pixels)", int_at_least(1)),
    "atol": ("a number > 0", lambda v: is_number(v) and v > 0),
    "threads": ("an integer >= 0 (0: the default)", int_at_least(0)),
    "mode": (f"one of {', '.join(MODES)}", lambda v: v in MODES),  # predict
    "crop": ("null or a positive size: H or [H, W] in pixels", optional_size),
    "stride": ("null or a positive size: H or [H, W] in pixels", optional_size),
    "format": (f"one of {', '.join(EXPORT_FORMATS)}", lambda v: v in EXPORT_FORMATS),  # export
}
ABSENT = object()


class NothingToDo(Exception):  # noqa: N818 (an outcome, not a failure)
    """The command has nothing to do (a finished run resumed): the message is printed, the status is 0,
    and nothing is left behind, as for a refused command."""


def shown(value: Any) -> str:
    """A value as the user would write it back: strings quoted, lists as lists."""
    return repr(value) if isinstance(value, str) else str(value)


def check_values(cfg: DictConfig) -> None:
    """Every ``VALUE_RULES`` key present in ``cfg`` has a value of the expected type and range (all bad
    keys are listed in one line), required keys (``???``) are set, and an ``out`` directory can be
    written. Every command runs this on its composed config before anything else (``segattn.cli``)."""
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ValueError(f"missing required key(s): {', '.join(f'{key}=...' for key in missing)}")
    problems = []
    for key, (expected, ok) in VALUE_RULES.items():
        value = OmegaConf.select(cfg, key, default=ABSENT)
        if value is ABSENT:
            continue
        value = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
        if not ok(value):
            problems.append(f"{key}={shown(value)}: expected {expected}")
    if cfg.get("mode") == "slide" and cfg.get("crop") is None:  # predict
        problems.append("mode=slide needs crop=H or crop=[H,W] (the window size)")
    if problems:
        raise ValueError("; ".join(problems))
    if cfg.get("out") is not None:
        check_out_dir(Path(str(cfg.out)))


def check_out_dir(out: Path) -> None:
    """``out=`` (export, predict) must be a directory or creatable as one, by this user."""
    check_writable_dir("out", out)


def check_writable_dir(key: str, folder: Path) -> None:
    """The folder set by ``key`` (``out``, ``hydra.run.dir``, ``paths.log_dir``) is a directory this user can
    write, or can be created as one."""
    if folder.exists() and not folder.is_dir():
        raise ValueError(
            f"{key}={folder}: is an existing file; expected a directory to write into (created if missing)"
        )
    existing = next(parent for parent in (folder, *folder.absolute().parents) if parent.exists())
    if not existing.is_dir():
        raise ValueError(
            f"{key}={folder}: cannot be created: {existing} is a file; expected a directory path"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{key}={folder}: cannot be written: {existing} is not writable by this user")


def check_run_name(run_name: Any) -> None:
    """``run_name`` names the run's folder (``<log dir>/runs/<time>_<run_name>``): one folder name, so that
    the run stays inside the runs folder."""
    text = str(run_name)
    if "/" in text or "\\" in text or text in ("", ".", ".."):
        raise ValueError(
            f"run_name={text}: expected a name without '/' or '\\' (it names the run's folder, inside "
            "paths.log_dir); set hydra.run.dir=<folder> to choose the folder itself"
        )


def check_data_root(data: DictConfig | dict[str, Any]) -> None:
    """A dataset read from disk needs ``data.root`` to be a folder. Unknown names are left to the
    dataset registry, whose error lists the valid ones; the synthetic dataset has no files."""
    from .data.registry import available_datasets  # the data stack is heavy; only train and eval need it

    name, root = data.get("name"), data.get("root")
    if name == "synthetic" or name not in available_datasets():
        return
    if root is None or not Path(str(root)).is_dir():
        what = (
            "is not set" if root is None else ("is a file" if Path(str(root)).exists() else "does not exist")
        )
        raise FileNotFoundError(
            f"data.root={root}: {what}; expected the folder holding dataset {name!r} (see data/README.md)"
        )


def check_config(cfg: DictConfig) -> None:
    """Fail before training on bad values, a missing dataset folder and settings that contradict each
    other, naming the keys."""
    check_values(cfg)
    check_data_root(cfg.data)
    if cfg.get("ckpt_path") and cfg.get("init_from"):
        raise ValueError(
            f"ckpt_path={cfg.ckpt_path} resumes a run and init_from={cfg.init_from} starts a new one "
            "from weights; set only one"
        )
    check_validation(cfg.validation)
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
    import torch

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


def check_validation(validation: DictConfig) -> None:
    """``validation.*`` (train, test and eval): a known mode, and a window for slide mode."""
    if validation.mode not in MODES:
        raise ValueError(f"validation.mode={validation.mode!r}; expected one of {', '.join(MODES)}")
    if validation.mode == "slide" and not validation.crop_size:
        raise ValueError(
            "validation.mode=slide needs validation.crop_size (and optionally validation.stride)"
        )
