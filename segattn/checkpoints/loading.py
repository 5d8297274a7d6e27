"""Save and rebuild trained models without Lightning or Hydra, and without running code found in files.

Three sources rebuilt from registry names: a Lightning checkpoint from ``train.py`` (weights under
``state_dict`` with prefix ``model.``, its ``ModelRecord`` under ``ckpt["segattn"]``), an exported directory
(``model.safetensors`` + ``segattn.json``) and a Hugging Face SegFormer folder (``config.json`` + weights).
All load tensors with ``weights_only=True`` / safetensors and rebuild the network with ``build_model``,
where every name is looked up in a registry; import paths are never followed. A TorchScript export is a
program, loaded by ``torch.jit.load`` as it is. ``segattn.inference.trained.open_model`` opens any of them
(or an ONNX file) for the commands.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import Tensor, nn

from ..errors import FileFormatError, one_line
from ..files import atomic_write, atomic_write_text
from ..images import CLASSES_FILE, read_classes
from ..record import (
    FORMAT_VERSION,
    MODEL_SOURCES,
    RECORD_FILE,
    TORCHSCRIPT_FILE,
    WEIGHTS_FILE,
    ModelRecord,
    check_plain_config,
)
from .resume import other_model_kind, read_checkpoint, wrong_kind

PREVIOUS_RECORD_FILE = "model.yaml"  # the record of a folder exported before segattn.json, with classes.json


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
    record = ModelRecord.from_checkpoint(ckpt, path)
    model = rebuild(record.model, str(path))
    prefix = "model."
    state = {key[len(prefix) :]: value for key, value in ckpt["state_dict"].items() if key.startswith(prefix)}
    load_weights(lambda: model.load_state_dict(state, strict=False), str(path))
    return model.eval(), record


def load_exported(directory: Path) -> tuple[nn.Module, ModelRecord]:
    """An exported directory: ``segattn.json`` (or an earlier export's ``model.yaml`` and ``classes.json``)
    and ``model.safetensors``."""
    from safetensors import SafetensorError
    from safetensors.torch import load_model as load_safetensors

    again = "export it again with python -m segattn.export format=safetensors"
    previous = not (directory / RECORD_FILE).is_file() and (directory / PREVIOUS_RECORD_FILE).is_file()
    source = directory / (PREVIOUS_RECORD_FILE if previous else RECORD_FILE)
    if not source.is_file() and other_model_kind("checkpoint", directory):
        raise wrong_kind("checkpoint", directory, MODEL_SOURCES)
    for path in (source, directory / WEIGHTS_FILE):
        if not path.is_file():
            raise FileNotFoundError(
                f"{directory}: missing {path.name}; an exported model directory holds {WEIGHTS_FILE} and "
                f"{RECORD_FILE} (python -m segattn.export format=safetensors)"
            )
    content = previous_export_record(directory) if previous else source.read_text()
    record = ModelRecord.read(content, str(source), "", source.name, again)
    model = rebuild(record.model, str(source))
    weights = directory / WEIGHTS_FILE
    try:
        load_weights(lambda: load_safetensors(model, weights, strict=False), str(weights))
    except SafetensorError as error:  # truncated, or not a safetensors file at all
        raise FileFormatError(
            f"{weights}: not a readable safetensors file ({error}); {again}", weights
        ) from None
    return model.eval(), record


def previous_export_record(directory: Path) -> Any:
    """The record document of a folder exported before ``segattn.json``: its ``model.yaml``
    (``yaml.safe_load``: no Python tags) with the classes and palette of its ``classes.json``."""
    source = directory / PREVIOUS_RECORD_FILE
    try:
        meta = yaml.safe_load(source.read_text())
    except yaml.YAMLError as error:  # safe_load refuses python/object tags: they could run code
        raise FileFormatError(f"{source}: not a plain YAML mapping: {one_line(error)}", source) from None
    if isinstance(meta, dict) and (directory / CLASSES_FILE).is_file():
        spec = read_classes(directory / CLASSES_FILE)
        data = meta.get("data") if isinstance(meta.get("data"), dict) else {}
        meta = {**meta, "data": {**data, "classes": spec.names, "palette": spec.palette}}
    return meta


def load_torchscript(path: Path, device: str) -> tuple[nn.Module, ModelRecord]:
    """A TorchScript export (``model.pt`` or the folder holding it) loaded by ``torch.jit.load`` onto
    ``device``, and the record in its extra file ``segattn.json``."""
    file = path / TORCHSCRIPT_FILE if path.is_dir() else path
    again = "export it again with python -m segattn.export format=torchscript"
    extra = {RECORD_FILE: ""}  # filled by torch.jit.load; stays empty when the file has none
    try:
        with warnings.catch_warnings():
            # torch.jit is marked deprecated in favour of torch.export; it still loads fine.
            warnings.simplefilter("ignore", FutureWarning)
            network = torch.jit.load(str(file), map_location=device, _extra_files=extra)
    except RuntimeError as error:
        raise FileFormatError(
            f"{file}: not a TorchScript module torch.jit.load reads ({one_line(error)}); {again}", file
        ) from None
    record = ModelRecord.read(
        extra[RECORD_FILE] or None, str(file), RECORD_FILE, f"extra file {RECORD_FILE}", again
    )
    return network.eval(), record


def load_segformer_folder(directory: Path) -> tuple[nn.Module, ModelRecord]:
    """A Hugging Face SegFormer segmentation folder (``config.json`` + weights): the pvt model it describes
    and a record of its classes (``id2label``) and ignore index; ImageNet normalisation, as SegFormer's."""
    from ..models import build_model
    from ..models.segformer import read_segformer

    segformer = read_segformer(str(directory), directory)
    if not segformer.is_segmentation:
        raise ValueError(
            f"{directory}: a SegFormer encoder (MiT) without a decode head predicts no classes; train "
            f"from it with model=pvt model.pretrained={directory}"
        )
    model = build_model("pvt", len(segformer.classes), pretrained=str(directory))
    data = {
        "classes": segformer.classes,
        "ignore_index": segformer.config.get("semantic_loss_ignore_index", 255),
    }
    return model.eval(), ModelRecord.from_sections(model.config, data)


def stored_tensors(model: nn.Module) -> dict[str, Tensor]:
    """The model's state as safetensors stores it: contiguous, a tensor shared by several names once, under
    its first name (``load_model(strict=False)`` fills the others, which are the same tensor)."""
    stored: dict[str, Tensor] = {}
    seen: set[tuple[int, tuple[int, ...]]] = set()
    for name, tensor in model.state_dict().items():
        key = (tensor.data_ptr(), tuple(tensor.shape))
        if key not in seen:
            seen.add(key)
            stored[name] = tensor.contiguous()
    return stored


def save_exported(model: nn.Module, record: ModelRecord, directory: Path) -> None:
    """Write ``model.safetensors`` and ``segattn.json``, the record."""
    from safetensors.torch import save

    directory.mkdir(parents=True, exist_ok=True)
    metadata = {"format": "segattn", "version": str(FORMAT_VERSION)}
    # Serialised in memory and written by Python, so a full disk is a DiskError naming the folder (the
    # library's own writer reported it as an unreadable file).
    data = save(stored_tensors(model), metadata)
    atomic_write(directory / WEIGHTS_FILE, lambda handle: handle.write(data))
    atomic_write_text(directory / RECORD_FILE, record.to_json())


__all__ = [
    "check_plain_config",
    "load_checkpoint",
    "load_exported",
    "load_segformer_folder",
    "load_torchscript",
    "save_exported",
]
