"""The checks a config must pass before anything starts: each command's schema (``SCHEMAS``: the type and
range of every value a user sets, by full dotted key, and the settings that span keys), keys that were
renamed (``RENAMED``) or belong to another command (``MISPLACED``), required keys, paths and the kernel
switch. Builders check their own arguments (model and attention options, dataset names); what is checked
here fails before any run dir content, logger or trainer exists, with one line per bad key naming the key,
the value and what was expected. train.py's checks of its trainer settings live with the training code
(``segattn.training.config_checks``).

The schemas are explicit tables rather than Hydra structured configs: a structured config checks types
only, where these rules also say the range or the choices expected (``at_least(1)``: "an integer >= 1",
``one_of(MODES)``: "one of whole, slide"), every bad value of a command line is listed in one line instead
of Hydra's error for the first, and the defaults stay in one place, the yaml files, instead of being
repeated in dataclasses (one per dataset file for the ``data`` group, whose keys differ by dataset). A key
whose type says all it takes (``seed``, ``stream``) has no rule: its yaml default's type is checked
(``default_types``)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ..errors import ConfigError
from ..images import DOWNSAMPLE, as_hw, is_downsample
from ..inference.device import DEVICE_FORMS, is_device
from ..tiling import (
    INFERENCE,
    NO_WINDOW,
    SIZE,
    Rule,
    at_least,
    int_at_least,
    is_int,
    is_number,
    one_of,
    optional_size,
    positive_size,
)
from .resolvers import plain

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


def batch_limit(value: Any) -> bool:
    """Lightning's ``limit_*_batches``: null, a batch count, or a fraction in [0, 1]."""
    return value is None or (is_int(value) and value >= 0) or (isinstance(value, float) and 0 <= value <= 1)


SpanCheck = Callable[[DictConfig], "str | None"]  # a problem between keys, or None


@dataclass(frozen=True)
class Schema:
    """The value checks of one command's config: a rule for each full dotted key, and the checks that span
    several keys. Keys are full paths, so a key of the same name in another command or group is never
    checked by this rule. A key absent from the composed config (an option one dataset has and another has
    not) is skipped."""

    rules: dict[str, Rule]
    spans: tuple[SpanCheck, ...] = ()


EXPORT_FORMATS = ("onnx", "torchscript", "safetensors")  # segattn.export.command.FORMATS
THREADS: dict[str, Rule] = {"threads": at_least(0, "(0: the default)")}
DEVICE: dict[str, Rule] = {"device": (DEVICE_FORMS, is_device)}
TRAINER: dict[str, Rule] = {
    "trainer.max_epochs": (
        "an integer >= -1 (-1: no limit) or null",
        lambda v: v is None or int_at_least(-1)(v),
    ),
    "trainer.max_steps": at_least(-1, "(-1: no limit)"),
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
    "trainer.num_nodes": at_least(1),
    "trainer.precision": (f"one of {', '.join(PRECISIONS)}", lambda v: str(v) in PRECISIONS),
    "trainer.log_every_n_steps": at_least(1),
    "trainer.accumulate_grad_batches": at_least(1),
    "trainer.check_val_every_n_epoch": ("an integer >= 1 or null", lambda v: v is None or int_at_least(1)(v)),
    "trainer.num_sanity_val_steps": at_least(-1, "(-1: all)"),
    "trainer.gradient_clip_val": ("a number >= 0 or null", lambda v: v is None or (is_number(v) and v >= 0)),
    "trainer.limit_train_batches": ("null, a batch count >= 0 or a fraction in [0, 1]", batch_limit),
    "trainer.limit_val_batches": ("null, a batch count >= 0 or a fraction in [0, 1]", batch_limit),
    "trainer.deterministic": ("true, false or 'warn'", lambda v: isinstance(v, bool) or v == "warn"),
}
DATA: dict[str, Rule] = {
    "data.batch_size": at_least(1),
    "data.val_batch_size": at_least(1),
    "data.num_workers": at_least(0),
    "data.crop_size": (f"{SIZE}, or null (train on whole images)", optional_size),
    "data.downsample": (DOWNSAMPLE, is_downsample),
    "data.image_size": (SIZE, positive_size),
    "data.window_size": (SIZE, positive_size),
    "data.windows_per_split": at_least(1),
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
}
OPTIMIZATION: dict[str, Rule] = {
    "optimizer.lr": ("a number >= 0", lambda v: is_number(v) and v >= 0),
    "optimizer.weight_decay": ("a number >= 0", lambda v: is_number(v) and v >= 0),
    "optimizer.eps": ("a number > 0", lambda v: is_number(v) and v > 0),
    "scheduler.warmup_steps": at_least(0),
}
INFERENCE_RULES = {f"inference.{key}": rule for key, rule in INFERENCE.items()}


def slide_has_window(cfg: DictConfig) -> str | None:
    """``inference.mode=slide`` needs the window size."""
    if OmegaConf.select(cfg, "inference.mode") == "slide" and OmegaConf.select(cfg, "inference.crop") is None:
        return NO_WINDOW
    return None


def stride_within_window(cfg: DictConfig) -> str | None:
    """In slide mode, ``inference.stride`` no larger than ``inference.crop`` on either side: a wider step
    would skip pixels (``segattn.tiling`` refuses it, at the first image: after a whole epoch in train)."""
    if OmegaConf.select(cfg, "inference.mode") != "slide":
        return None
    crop, stride = (
        plain(OmegaConf.select(cfg, "inference.crop")),
        plain(OmegaConf.select(cfg, "inference.stride")),
    )
    if crop is None or stride is None or not (positive_size(crop) and positive_size(stride)):
        return None  # the keys' own rules name a bad size
    if any(step > side for step, side in zip(as_hw(stride), as_hw(crop), strict=True)):
        return (
            f"inference.stride={shown(stride)} is larger than inference.crop={shown(crop)}: the windows "
            "would skip pixels; expected a stride <= the window (null: half the window)"
        )
    return None


INFERENCE_SPANS = (slide_has_window, stride_within_window)

# python -m segattn.bench: a key left null takes the value of the part's grid (conf/bench/<part>.yaml); the
# variants, models and kernels are checked by the bench against its registries and the device.
COUNT = r"[1-9][0-9]*[kKmM]?"  # 4096, 4k, 1m
IMAGE_SIZE = r"[1-9][0-9]*([xX×][1-9][0-9]*)?"  # 2048, 4288x2848


def unset_or(expected: str, ok: Callable[[Any], bool]) -> Rule:
    """A bench key that null leaves to the part's grid."""
    return (f"{expected} or null (the grid's)", lambda value: value is None or ok(value))


def list_of(ok: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, list) and len(value) > 0 and all(ok(item) for item in value)


def positive_number(value: Any) -> bool:
    return is_number(value) and value > 0


def matches(pattern: str) -> Callable[[Any], bool]:
    return lambda value: not isinstance(value, bool) and re.fullmatch(pattern, str(value)) is not None


BENCH_DTYPES = ("fp32", "bf16", "fp16")
BENCH: dict[str, Rule] = {
    **THREADS,
    "grid": one_of(("auto", "smoke", "cpu", "cuda")),
    "clock": one_of(("wall", "cpu")),
    "device": ("null, cpu or cuda[:i]", lambda v: v is None or re.fullmatch(r"cpu|cuda(:[0-9]+)?", str(v))),
}
BENCH_SEARCH: dict[str, Rule] = {
    **{key: unset_or(*at_least(1, "(pixels)")) for key in ("start", "step", "max_size")},
    "probe_timeout": unset_or("a number > 0 (seconds)", positive_number),
    "budget_gib": unset_or("a number > 0 (GiB)", positive_number),
}
SCHEMAS: dict[str, Schema] = {  # by command: the name of its file in conf/
    "train": Schema(
        {**TRAINER, **DATA, **OPTIMIZATION, **INFERENCE_RULES},
        INFERENCE_SPANS,
    ),
    "eval": Schema(
        {
            **DATA,
            **INFERENCE_RULES,
            **THREADS,
            **DEVICE,
            "num_examples": at_least(0),
            "devices": at_least(1, "(processes, each scoring a share of the split)"),
        },
        INFERENCE_SPANS,
    ),
    "predict": Schema(
        {
            **INFERENCE_RULES,
            **THREADS,
            **DEVICE,
            "num_workers": at_least(0),
            "alpha": ("an opacity in [0, 1]", lambda v: is_number(v) and 0 <= v <= 1),
        },
        INFERENCE_SPANS,
    ),
    "export": Schema(
        {
            **THREADS,
            "opset": ("an ONNX opset, an integer >= 17", int_at_least(17)),
            "height": at_least(1, "(pixels)"),
            "width": at_least(1, "(pixels)"),
            "atol": ("a number > 0", lambda v: is_number(v) and v > 0),
            "format": one_of(EXPORT_FORMATS),
        }
    ),
    "doctor": Schema(DATA),
    "bench/op": Schema(
        {
            **BENCH,
            "tokens": unset_or("a list of token counts (4096, 4k, 1m)", list_of(matches(COUNT))),
            "dtypes": (f"a list of {', '.join(BENCH_DTYPES)}", list_of(lambda v: v in BENCH_DTYPES)),
            "modes": ("a list of fwd, fwdbwd", list_of(lambda v: v in ("fwd", "fwdbwd"))),
            **{key: at_least(1) for key in ("batch", "dim", "heads")},
            "repeats": unset_or(*at_least(1)),
            "warmup": at_least(0),
            "config_seconds": unset_or("a number > 0 (seconds)", positive_number),
            "max_call_seconds": unset_or("a number > 0 (seconds)", positive_number),
            "profile_tokens": unset_or("a token count (4096, 4k, 1m)", matches(COUNT)),
        }
    ),
    "bench/model": Schema(
        {
            **BENCH,
            "image_sizes": unset_or(
                "a list of sides or WIDTHxHEIGHT (2048, 4288x2848)", list_of(matches(IMAGE_SIZE))
            ),
            "dtypes": unset_or(f"a list of {', '.join(BENCH_DTYPES)}", list_of(lambda v: v in BENCH_DTYPES)),
            "batch": ("a list of integers >= 1", list_of(int_at_least(1))),
            "repeats": unset_or(*at_least(1)),
            "max_step_seconds": unset_or("a number > 0 (seconds)", positive_number),
            "time_budget": unset_or("a number > 0 (seconds)", positive_number),
        }
    ),
    "bench/maxres": Schema(
        {
            **BENCH,
            **BENCH_SEARCH,
            "checkpointing": one_of(("off", "on", "both")),
            "spatial": ("a list of band counts >= 1", list_of(int_at_least(1))),
            "dtype": unset_or(*one_of(BENCH_DTYPES)),
            "extrapolate_gib": (
                "a number > 0 (GiB) or null (none)",
                lambda v: v is None or positive_number(v),
            ),
        }
    ),
    "bench/raster": Schema(
        {
            **BENCH,
            **{key: unset_or(*at_least(1, "(pixels)")) for key in ("size", "crop", "stride")},
            **{key: at_least(1) for key in ("crop_batch_size", "classes")},
            "baseline": unset_or("true or false", lambda v: isinstance(v, bool)),
        }
    ),
    "bench/predict": Schema(
        {
            **BENCH,
            "checkpoint": (
                "a path (.ckpt, safetensors folder, model.onnx) or null",
                lambda v: v is None or isinstance(v, str),
            ),
            "formats": ("a list of torch, onnx", list_of(lambda v: v in ("torch", "onnx"))),
            "image_sizes": unset_or(
                "a list of sides or WIDTHxHEIGHT (1296x966)", list_of(matches(IMAGE_SIZE))
            ),
            "precisions": unset_or(
                f"a list of {', '.join(BENCH_DTYPES)}", list_of(lambda v: v in BENCH_DTYPES)
            ),
            "batch": unset_or("a list of integers >= 1", list_of(int_at_least(1))),
            "num_workers": unset_or("a list of integers >= 0", list_of(int_at_least(0))),
            "images": unset_or(*at_least(1)),
            "repeats": at_least(5),
        }
    ),
    "bench/traffic": Schema(
        {
            **{key: at_least(1) for key in ("size", "batch", "num_classes")},
            "precision": one_of(("bf16-mixed", "32-true")),
            "paths": one_of(("gpu", "cpu")),
            # fast_path's KERNEL_BACKENDS (test_traffic.py holds them equal): config stays torch-free
            "kernel": one_of(("auto", "torch", "triton", "loss", "upsample", "head", "ffn", "residual")),
            "bandwidth": ("a number > 0 (bytes/s)", positive_number),
        }
    ),
}
# Keys a command no longer reads, with the key that replaced each: typed on a command line, the old one is
# refused naming the new one (``check_renamed``) instead of Hydra's "Could not override" traceback.
INFERENCE_KEYS = ("mode", "crop", "stride", "crop_batch_size", "scales", "flip")
RENAMED: dict[str, dict[str, str]] = {
    "train": {"validation": "inference", "validation.crop_size": "inference.crop"}
    | {f"validation.{key}": f"inference.{key}" for key in INFERENCE_KEYS if key != "crop"},
    "predict": {key: f"inference.{key}" for key in INFERENCE_KEYS},
}
RENAMED["eval"] = RENAMED["train"]
# Keys of another command typed on this one: the line says which key this command reads instead.
MISPLACED: dict[str, dict[str, str]] = {
    "train": {
        "checkpoint": "train.py does not read checkpoint= (eval, export and predict do): use "
        "ckpt_path={value} to resume that run or init_from={value} to fine-tune from its weights",
    },
    "eval": {
        "ckpt_path": "eval.py scores checkpoint=<ckpt>: write checkpoint={value}",
        "init_from": "eval.py scores checkpoint=<ckpt>: write checkpoint={value}",
    },
    "predict": {
        "model": "segattn.predict runs checkpoint=<ckpt | exported dir | model.onnx>: write "
        "checkpoint={value}"
    },
    "export": {"model": "segattn.export reads checkpoint=<ckpt | exported dir>: write checkpoint={value}"},
}
# Commands that build a network, so read SEGATTN_KERNEL / SEGATTN_FUSED (``check_kernel``).
BUILDS_A_MODEL = (
    "train",
    "eval",
    "predict",
    "export",
    *(f"bench/{part}" for part in ("op", "model", "maxres", "raster", "predict", "traffic")),
)
ABSENT = object()


class NothingToDo(Exception):  # noqa: N818 (an outcome, not a failure)
    """The command has nothing to do (a finished run resumed): the message is printed, the status is 0,
    and nothing is left behind, as for a refused command."""


def shown(value: Any) -> str:
    """A value as the user would write it back: strings quoted, lists as lists."""
    return repr(value) if isinstance(value, str) else str(value)


def check_renamed(command: str, overrides: Sequence[str]) -> None:
    """A key ``command`` no longer reads, typed on its command line (``validation.crop_size=...``), is a
    ConfigError naming the key and the one that replaced it; so is a key of another command
    (``train.py checkpoint=``: resume with ckpt_path= or fine-tune with init_from=)."""
    renamed, misplaced = RENAMED.get(command, {}), MISPLACED.get(command, {})
    problems = []
    for override in overrides:
        key, sep, value = override.lstrip("+~").partition("=")
        if key in renamed:
            problems.append(f"{key} is now {renamed[key]}: write {renamed[key]}{sep}{value}")
        elif key in misplaced:
            problems.append(misplaced[key].format(value=value or "<file>"))
    if problems:
        raise ConfigError("; ".join(problems))


def check_values(cfg: DictConfig, command: str, defaults: DictConfig | None = None) -> None:
    """Every key of ``command``'s schema (``SCHEMAS``) present in ``cfg`` has a value of the expected type
    and range, every other key the type of its default in ``defaults`` (``default_types``), and the
    settings that span keys agree (all problems are listed in one line); required keys (``???``) are set,
    and an ``out`` directory can be written. Every command runs this once, on its composed config, before
    anything else: ``cli.run_command`` for export, predict and the doctor; train's and eval's ``run`` (first
    thing, given the defaults by ``cli.hydra_app``) for theirs."""
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(f"missing required key(s): {', '.join(f'{key}=...' for key in missing)}")
    schema = SCHEMAS[command]
    problems = []
    for key, (expected, ok) in schema.rules.items():
        value = plain(OmegaConf.select(cfg, key, default=ABSENT))
        if value is not ABSENT and not ok(value):
            problems.append(f"{key}={shown(value)}: expected {expected}")
    if defaults is not None:
        problems += default_types(cfg, defaults, skip=schema.rules.keys())
    problems += [problem for span in schema.spans if (problem := span(cfg)) is not None]
    if problems:
        raise ConfigError("; ".join(problems))
    if command in BUILDS_A_MODEL:
        check_kernel()
    if cfg.get("out") is not None:
        check_out_dir(Path(str(cfg.out)))


TYPED: dict[type, Rule] = {  # the type of a default -> what any value of that key must be
    bool: ("true or false", lambda v: isinstance(v, bool)),
    int: ("an integer", is_int),
    float: ("a number", is_number),
    str: ("a single value, not a list or mapping", lambda v: not isinstance(v, list | dict)),
}


def default_types(cfg: DictConfig, defaults: DictConfig, skip: Collection[str]) -> list[str]:
    """A problem for each key of ``cfg`` whose value is not of its default's type (``TYPED``): ``defaults`` is
    the command's config with the same config-group choices but none of the user's values, so a boolean key
    takes only true/false (``dice_present_only=no`` would otherwise be the string 'no', read as true), an
    integer key an integer. Keys in ``skip`` (those with a rule of their own), defaults that are null, lists,
    mappings or interpolations, and values that do not resolve are left to the other checks."""
    problems = []
    for key, default in leaves(OmegaConf.to_container(defaults, resolve=False)):
        if key in skip or type(default) not in TYPED:
            continue
        try:
            value = plain(OmegaConf.select(cfg, key, default=ABSENT))
        except Exception:  # an interpolation the run resolves later: not a type problem here
            continue
        expected, ok = TYPED[type(default)]
        if value is not ABSENT and not ok(value):
            problems.append(f"{key}={shown(value)}: expected {expected}")
    return problems


def leaves(tree: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of each leaf of nested dicts; interpolations (``${...}``) and required values
    (``???``) are skipped."""
    for name, value in tree.items():
        key = f"{prefix}{name}"
        if isinstance(value, dict):
            yield from leaves(value, f"{key}.")
        elif not (isinstance(value, str) and ("${" in value or value == "???")):
            yield key, value


def check_kernel() -> None:
    """SEGATTN_KERNEL and SEGATTN_FUSED as a model built now reads them (``layers.kernel_backend``): a value
    other than auto / torch / triton, or triton without triton installed or without a CUDA device and
    TRITON_INTERPRET=1, is a ConfigError before anything is built or written. Unset, torch is not imported."""
    if not (os.environ.get("SEGATTN_KERNEL") or os.environ.get("SEGATTN_FUSED")):
        return
    from ..layers.fast_path import kernel_backend

    try:
        kernel_backend()
    except (ValueError, RuntimeError) as error:
        raise ConfigError(str(error)) from None


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
    from ..data.registry import available_datasets  # the data stack is heavy; only train and eval need it

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
