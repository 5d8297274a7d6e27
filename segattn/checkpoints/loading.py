"""Save and rebuild trained models without Lightning or Hydra, and without running code found in files.

Two sources: a Lightning checkpoint from ``train.py`` (weights under ``state_dict`` with prefix ``model.``,
its ``ModelRecord`` under ``ckpt["segattn"]``) and an exported directory (``model.safetensors`` +
``model.yaml`` + ``classes.json``). Both load tensors with ``weights_only=True`` / safetensors and rebuild
the network with ``build_model(**config)``, where every name is looked up in a registry; import paths are
never followed. ``segattn.inference.trained.open_model`` opens either (or an ONNX file) for the commands.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from torch import nn

from ..errors import FileFormatError
from ..files import atomic_write_text, replacing
from ..images import CLASSES_FILE, read_classes, write_classes
from ..record import MODEL_FILE, WEIGHTS_FILE, ModelRecord
from .resume import read_checkpoint

FORMAT_VERSION = 1
PLAIN_TYPES = (str, int, float, bool, type(None))


def check_plain_config(value: Any, source: str, where: str = "model") -> None:
    """Accept only plain values (str/number/bool/None in lists and str-keyed dicts), no Hydra ``_target_``.

    A saved config names models and attention by registry name; anything that could point at a callable
    (an instantiate key, an object) is refused with the file and key in the message.
    """
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"{source}: key {key!r} in {where} is not a string")
            if key.startswith("_") and key.endswith("_"):
                raise ValueError(
                    f"{source}: {where}.{key} is refused: saved configs name models by registry name "
                    "(model name, attention name), never by import path or Hydra instantiate keys"
                )
            check_plain_config(item, source, f"{where}.{key}")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            check_plain_config(item, source, f"{where}[{index}]")
    elif not isinstance(value, PLAIN_TYPES):
        raise ValueError(f"{source}: {where} holds a {type(value).__name__}; expected plain config values")


def rebuild(config: dict[str, Any], source: str) -> nn.Module:
    """``build_model(**config)`` after ``check_plain_config``; errors name ``source``."""
    from ..models import build_model

    if not isinstance(config, dict) or not isinstance(config.get("name"), str):
        raise ValueError(f"{source}: model config must be a mapping with a registry 'name'; got {config!r}")
    check_plain_config(config, source)
    # The saved weights replace any pretrained encoder weights: never read a file or cache named in config.
    config = {**config, "pretrained": None} if config.get("pretrained") else config
    try:
        return build_model(**config)
    except (TypeError, ValueError, KeyError) as error:
        raise ValueError(f"{source}: cannot rebuild the model from its saved config: {error}") from None


def load_weights(load: Callable[[], tuple[list[str], list[str]]], source: str) -> None:
    """Run a non-strict ``load`` and fail, naming the file, on missing, unexpected or mis-shaped tensors."""
    try:
        missing, unexpected = load()
    except RuntimeError as error:  # shape mismatches: one line per tensor, the first few are enough
        lines = [line.strip() for line in str(error).splitlines()[1:4]]
        raise ValueError(f"{source}: weights do not match the rebuilt model: {' '.join(lines)}") from None
    if missing or unexpected:
        raise ValueError(
            f"{source}: weights do not match the rebuilt model: missing {missing[:5]} "
            f"({len(missing)} in all), unexpected {unexpected[:5]} ({len(unexpected)} in all)"
        )


def load_checkpoint(path: Path) -> tuple[nn.Module, ModelRecord]:
    """A Lightning checkpoint from ``train.py``: weights_only load, rebuild, strip the ``model.`` prefix."""
    ckpt = read_checkpoint(path)  # weights_only; empty, foreign or truncated files named as such
    meta = ckpt.get("segattn")
    if not isinstance(meta, dict) or "model" not in meta:
        raise ValueError(f"{path}: no ckpt['segattn']['model'] entry; expected a checkpoint from train.py")
    check_plain_config(meta, str(path), "segattn")
    model = rebuild(meta["model"], str(path))
    prefix = "model."
    state = {key[len(prefix) :]: value for key, value in ckpt["state_dict"].items() if key.startswith(prefix)}
    load_weights(lambda: model.load_state_dict(state, strict=False), str(path))
    return model.eval(), ModelRecord.from_sections(meta["model"], meta.get("data") or {})


def load_exported(directory: Path) -> tuple[nn.Module, ModelRecord]:
    """An exported directory: ``model.yaml`` (safe_load), ``model.safetensors`` and ``classes.json``."""
    from safetensors import SafetensorError
    from safetensors.torch import load_model as load_safetensors

    for name in (MODEL_FILE, WEIGHTS_FILE):
        if not (directory / name).is_file():
            raise FileNotFoundError(
                f"{directory}: missing {name}; an exported model directory holds {MODEL_FILE}, "
                f"{WEIGHTS_FILE} and classes.json (python -m segattn.export format=safetensors)"
            )
    source = str(directory / MODEL_FILE)
    try:
        meta = yaml.safe_load((directory / MODEL_FILE).read_text())
    except yaml.YAMLError as error:  # safe_load refuses python/object tags: they could run code
        raise ValueError(f"{source}: not a plain YAML mapping: {error}") from None
    if not isinstance(meta, dict) or "model" not in meta:
        raise ValueError(f"{source}: expected a mapping with a 'model' entry")
    check_plain_config(meta, source, "model.yaml")
    model = rebuild(meta["model"], source)
    weights = directory / WEIGHTS_FILE
    try:
        load_weights(lambda: load_safetensors(model, weights, strict=False), str(weights))
    except SafetensorError as error:  # truncated, or not a safetensors file at all
        raise FileFormatError(
            f"{weights}: not a readable safetensors file ({error}); export it again with "
            "python -m segattn.export format=safetensors",
            weights,
        ) from None
    data = dict(meta.get("data") or {})
    if (directory / CLASSES_FILE).is_file():
        spec = read_classes(directory / CLASSES_FILE)
        data.update(classes=spec.names, palette=spec.palette)
    return model.eval(), ModelRecord.from_sections(meta["model"], data)


def save_exported(model: nn.Module, record: ModelRecord, directory: Path) -> None:
    """Write ``model.safetensors``, ``model.yaml`` (config, normalisation) and ``classes.json``."""
    from safetensors.torch import save_model

    directory.mkdir(parents=True, exist_ok=True)
    metadata = {"format": "segattn", "version": str(FORMAT_VERSION)}
    with replacing(directory / WEIGHTS_FILE) as temp:
        save_model(model, str(temp), metadata=metadata)
    write_metadata(record, directory)


def write_metadata(record: ModelRecord, directory: Path) -> None:
    """``model.yaml`` and ``classes.json``: what every export format carries next to its weights."""
    data = {key: value for key, value in record.data_section().items() if key not in ("classes", "palette")}
    meta = {"format_version": FORMAT_VERSION, "model": record.model, "data": data}
    atomic_write_text(directory / MODEL_FILE, yaml.safe_dump(meta, sort_keys=False))
    write_classes(directory, record.classes, record.palette)


__all__ = ["check_plain_config", "load_checkpoint", "load_exported", "save_exported", "write_metadata"]
