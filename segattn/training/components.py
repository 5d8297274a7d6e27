"""A run's callbacks, loggers and trainer strategy, built from the config entries that name their classes by
Hydra ``_target_``: conf/callbacks/<name>.yaml, conf/logger/<name>.yaml and the ``strategy`` of
conf/trainer/<name>.yaml. Adding one is a YAML file; nothing here lists them.

``check_components`` imports every ``_target_`` and checks its kind before the run creates anything, so a
misspelt class is one line naming its key, not a traceback after the run directory, the loggers and the
W&B run exist. Only the composed config (conf/ and the command line) is instantiated: what a checkpoint or
an exported model stores is read back as plain values, and a ``_target_`` there is refused
(``record.check_plain_config``); the values a resumed run takes from its checkpoint (the W&B run id) are
passed to the built class as plain arguments, never through Hydra.
"""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Mapping
from typing import Any

import pytorch_lightning as pl
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from lightning_fabric.utilities.exceptions import MisconfigurationException
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.loggers import Logger, MLFlowLogger, TensorBoardLogger
from pytorch_lightning.strategies import Strategy

from ..config import config_dir, plain
from ..errors import ConfigError, one_line
from .checkpointing import check_monitor

STRATEGY = "trainer.strategy"


def import_target(target: str) -> Any:
    """What the dotted path ``target`` names (``package.module.Class``), found as Hydra finds a ``_target_``:
    the first part imported, each further part an attribute or else a submodule. Raises ImportError."""
    parts = target.split(".")
    found = importlib.import_module(parts[0])
    for index, part in enumerate(parts[1:], start=1):
        if hasattr(found, part):
            found = getattr(found, part)
            continue
        module = ".".join(parts[: index + 1])
        try:
            found = importlib.import_module(module)
        except ModuleNotFoundError as error:
            if error.name != module:  # the submodule exists but an import inside it failed
                raise
            raise ImportError(f"module {'.'.join(parts[:index])} has no {part!r}") from None
    return found


def target_class(key: str, spec: Mapping[str, Any], base: type) -> type:
    """The class that entry ``key``'s ``_target_`` names: a ConfigError naming ``<key>._target_`` when there
    is none, it does not import, or it is not a subclass of ``base``."""
    expected = f"expected the import path (package.module.Class) of a Lightning {base.__name__} subclass"
    target = spec.get("_target_")
    if not isinstance(target, str) or not target:
        raise ConfigError(f"{key} has no _target_: {expected}{selection_hint(key)}")
    if not all(part.isidentifier() for part in target.split(".")):
        raise ConfigError(f"{key}._target_={target!r} is not a dotted import path; {expected}")
    try:
        found = import_target(target)
    except ImportError as error:
        raise ConfigError(f"{key}._target_={target}: cannot import it ({error}); {expected}") from None
    if not (isinstance(found, type) and issubclass(found, base)):
        what = found.__name__ if isinstance(found, type) else f"a {type(found).__name__}"
        raise ConfigError(f"{key}._target_={target}: {what} is not a {base.__name__}; {expected}")
    return found


def selection_hint(key: str) -> str:
    """For ``+callbacks.early_stopping.patience=5`` without a ``_target_``: how to select the group's file of
    that name (conf/callbacks/early_stopping.yaml) instead, where there is one."""
    group, _, name = key.partition(".")
    if not (config_dir() / group / f"{name}.yaml").is_file():
        return ""
    chosen = HydraConfig.get().runtime.choices.get(group) if HydraConfig.initialized() else None
    selection = f"{group}=[{chosen},{name}]" if isinstance(chosen, str) else f"{group}=[...,{name}]"
    return f"; conf/{group}/{name}.yaml has one: select it beside the others, {selection}"


def entries(group: str, specs: Mapping[str, Any] | None) -> list[tuple[str, dict[str, Any]]]:
    """``(<group>.<name>, spec)`` for each entry of a group (``callbacks``, ``logger``) that is not null; an
    entry that is not a mapping is a ConfigError naming it."""
    found = []
    for name, spec in (specs or {}).items():
        key = f"{group}.{name}"
        if spec is None:
            continue
        if not isinstance(spec, Mapping):
            raise ConfigError(
                f"{key}={spec!r}: expected a mapping with the _target_ to build and its arguments, or null "
                "to drop it"
            )
        found.append((key, dict(spec)))
    return found


def build(key: str, spec: Mapping[str, Any], base: type, **extra: Any) -> Any:
    """The object entry ``key`` describes: its ``_target_`` class (checked by ``target_class``) called with
    the entry's arguments as plain values (nested ``_target_`` entries instantiated by Hydra) and ``extra``
    as given. An argument the class does not take, or arguments it refuses, are a ConfigError naming the
    key (Lightning's own refusals among them); a ValueError the class raises (naming its key) comes out as
    it raised it."""
    found = target_class(key, spec, base)
    check_arguments(key, found, [*spec, *extra])
    factory = instantiate({"_convert_": "all", **spec}, _partial_=True)
    try:
        return factory(**extra)
    except (TypeError, MisconfigurationException) as error:
        raise ConfigError(f"{key}: {found.__name__} refused its arguments: {one_line(error)}") from None


def check_arguments(key: str, found: type, names: list[str]) -> None:
    """Every argument of entry ``key`` (Hydra's own ``_target_``-style keys aside) is one that class
    ``found`` takes: else a ConfigError naming ``<key>.<argument>`` and the arguments it does take."""
    parameters = inspect.signature(found).parameters
    if any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters.values()):
        return
    for name in names:
        if not (name.startswith("_") and name.endswith("_")) and name not in parameters:
            raise ConfigError(
                f"{key}.{name}: {found.__name__} takes no argument {name!r}; it takes "
                f"{', '.join(parameters) or 'none'}"
            )


def build_group(group: str, specs: Mapping[str, Any] | None, base: type) -> list[Any]:
    """One object per non-null entry of ``group``, in the order of the config."""
    return [build(key, spec, base) for key, spec in entries(group, specs)]


def strategy_options(spec: Mapping[str, Any]) -> dict[str, Any]:
    """``trainer.strategy``'s arguments: all but ``name``, the label the config checks read
    (``trainer.strategy.name=fsdp``), which is not the strategy's."""
    return {key: value for key, value in spec.items() if key != "name"}


def build_strategy(spec: str | Mapping[str, Any]) -> str | Strategy:
    """``trainer.strategy``: a Lightning name (``auto``, ``ddp``), or a mapping with the ``_target_`` of a
    Strategy class, its arguments and ``name``."""
    if isinstance(spec, str):
        return spec
    return build(STRATEGY, strategy_options(spec), Strategy)


def check_strategy(spec: Any) -> None:
    """A mapping ``trainer.strategy`` names a Strategy class, and its ``name`` is the one that class declares
    (``strategy_name``): the config checks read the name, so a name that another class answers to would
    check one strategy and train with another."""
    if not isinstance(spec, Mapping):
        return
    strategy = target_class(STRATEGY, strategy_options(spec), Strategy)
    name, declared = spec.get("name"), getattr(strategy, "strategy_name", None)
    if name is not None and declared is not None and name != declared:
        raise ConfigError(
            f"{STRATEGY}.name={name} but {STRATEGY}._target_={spec['_target_']} is the {declared!r} "
            f"strategy; expected {STRATEGY}.name={declared}, or the trainer config of the strategy meant "
            "(trainer=<name>)"
        )


# Loggers whose package is an optional extra: the packages any of which serves it, and what to install.
LOGGER_EXTRAS = {
    MLFlowLogger: (("mlflow",), "'segattn[mlflow]' (mlflow-skinny)"),
    TensorBoardLogger: (("tensorboard", "tensorboardX"), "'segattn[tensorboard]'"),
}


def check_components(cfg: DictConfig) -> None:
    """Check, before the run creates anything, that every callback, logger and the trainer's strategy names
    a class of its kind that imports, that a logger finds its optional package (``LOGGER_EXTRAS``), and
    that a checkpoint or early-stopping callback monitors a metric the run logs."""
    for key, spec in entries("callbacks", plain(cfg.get("callbacks"))):
        check_monitor(key, target_class(key, spec, pl.Callback), spec)
    for key, spec in entries("logger", plain(cfg.get("logger"))):
        logger = target_class(key, spec, Logger)
        for kind, (packages, extra) in LOGGER_EXTRAS.items():
            if issubclass(logger, kind) and not any(importlib.util.find_spec(name) for name in packages):
                missing = f"{logger.__name__} needs {packages[0]}, which is not installed"
                raise ConfigError(f"{key}: {missing}; pip install {extra}")
    check_strategy(plain(OmegaConf.select(cfg, STRATEGY)))
