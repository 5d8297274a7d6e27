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

from torch import Tensor, nn

from ..errors import FileFormatError
from ..files import atomic_write
from ..record import FORMAT_VERSION, MODEL_FILE, WEIGHTS_FILE, ModelRecord, check_plain_config
from .resume import read_checkpoint


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
    """An exported directory: ``model.yaml`` (safe_load), ``model.safetensors`` and ``classes.json``."""
    from safetensors import SafetensorError
    from safetensors.torch import load_model as load_safetensors

    for name in (MODEL_FILE, WEIGHTS_FILE):
        if not (directory / name).is_file():
            raise FileNotFoundError(
                f"{directory}: missing {name}; an exported model directory holds {MODEL_FILE}, "
                f"{WEIGHTS_FILE} and classes.json (python -m segattn.export format=safetensors)"
            )
    record = ModelRecord.read_model_yaml(directory)
    model = rebuild(record.model, str(directory / MODEL_FILE))
    weights = directory / WEIGHTS_FILE
    try:
        load_weights(lambda: load_safetensors(model, weights, strict=False), str(weights))
    except SafetensorError as error:  # truncated, or not a safetensors file at all
        raise FileFormatError(
            f"{weights}: not a readable safetensors file ({error}); export it again with "
            "python -m segattn.export format=safetensors",
            weights,
        ) from None
    return model.eval(), record


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
    """Write ``model.safetensors``, ``model.yaml`` (config, normalisation) and ``classes.json``."""
    from safetensors.torch import save

    directory.mkdir(parents=True, exist_ok=True)
    metadata = {"format": "segattn", "version": str(FORMAT_VERSION)}
    # Serialised in memory and written by Python, so a full disk is a DiskError naming the folder (the
    # library's own writer reported it as an unreadable file).
    data = save(stored_tensors(model), metadata)
    atomic_write(directory / WEIGHTS_FILE, lambda handle: handle.write(data))
    record.write_model_yaml(directory)


__all__ = ["check_plain_config", "load_checkpoint", "load_exported", "save_exported"]
