"""Save and rebuild trained models without Lightning or Hydra, and without running code found in files.

Two sources: a Lightning checkpoint from ``train.py`` (weights under ``state_dict`` with prefix ``model.``,
config under ``ckpt["segattn"]``) and an exported directory (``model.safetensors`` + ``model.yaml`` +
``classes.json``). Both load tensors with ``weights_only=True`` / safetensors and rebuild the network with
``build_model(**config)``, where every name is looked up in a registry; import paths are never followed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from torch import nn

from ..images import CLASSES_FILE, IMAGENET_MEAN, IMAGENET_STD, default_palette, read_classes, write_classes
from .resume import read_checkpoint

MODEL_FILE = "model.yaml"
WEIGHTS_FILE = "model.safetensors"
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


def describe(config: dict[str, Any], data: dict[str, Any], source: Path, fmt: str) -> dict[str, Any]:
    """The info dict returned next to the model: classes, palette, normalisation, the model config."""
    num_classes = int(config["num_classes"])
    classes = list(data.get("classes") or [str(index) for index in range(num_classes)])
    palette = [tuple(colour) for colour in (data.get("palette") or default_palette(num_classes))]
    return {
        "format": fmt,
        "path": str(source),
        "model": dict(config),
        "num_classes": num_classes,
        "classes": classes,
        "palette": palette,
        "mean": [float(v) for v in data.get("mean", IMAGENET_MEAN)],
        "std": [float(v) for v in data.get("std", IMAGENET_STD)],
        "ignore_index": int(data.get("ignore_index", 255)),
        "dataset": data.get("name"),
        "data_config": data.get("config"),
    }


def load_checkpoint(path: Path) -> tuple[nn.Module, dict[str, Any]]:
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
    return model.eval(), describe(meta["model"], meta.get("data") or {}, path, "checkpoint")


def load_exported(directory: Path) -> tuple[nn.Module, dict[str, Any]]:
    """An exported directory: ``model.yaml`` (safe_load), ``model.safetensors`` and ``classes.json``."""
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
    load_weights(lambda: load_safetensors(model, weights, strict=False), str(weights))
    data = dict(meta.get("data") or {})
    if (directory / CLASSES_FILE).is_file():
        spec = read_classes(directory / CLASSES_FILE)
        data.update(classes=spec.names, palette=spec.palette)
    return model.eval(), describe(meta["model"], data, directory, "safetensors")


def load_model(path: str | Path) -> tuple[nn.Module, dict[str, Any]]:
    """(Segmentor in eval mode on CPU, info) from a train.py checkpoint or an exported safetensors directory.

    info holds ``classes``, ``palette``, ``mean``, ``std``, ``num_classes``, ``ignore_index`` and ``model``
    (the config ``build_model`` was called with).
    """
    path = Path(path)
    if path.is_dir():
        return load_exported(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such checkpoint file or exported model directory")
    if path.suffix == ".onnx":
        raise ValueError(
            f"{path}: an ONNX model runs in onnxruntime: python -m segattn.predict checkpoint={path}"
        )
    return load_checkpoint(path)


def save_exported(model: nn.Module, info: dict[str, Any], directory: Path) -> None:
    """Write ``model.safetensors``, ``model.yaml`` (config, normalisation) and ``classes.json``."""
    from safetensors.torch import save_model

    directory.mkdir(parents=True, exist_ok=True)
    metadata = {"format": "segattn", "version": str(FORMAT_VERSION)}
    save_model(model, str(directory / WEIGHTS_FILE), metadata=metadata)
    write_metadata(info, directory)


def write_metadata(info: dict[str, Any], directory: Path) -> None:
    """``model.yaml`` and ``classes.json``: what every export format carries next to its weights."""
    meta = {
        "format_version": FORMAT_VERSION,
        "model": info["model"],
        "data": {
            "name": info.get("dataset"),
            "mean": info["mean"],
            "std": info["std"],
            "ignore_index": info["ignore_index"],
            "config": info.get("data_config"),
        },
    }
    (directory / MODEL_FILE).write_text(yaml.safe_dump(meta, sort_keys=False))
    write_classes(directory, info["classes"], info["palette"])


__all__ = ["check_plain_config", "load_checkpoint", "load_exported", "load_model", "save_exported"]
