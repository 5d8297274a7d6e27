"""Reading a train.py checkpoint file, and what resume and ``init_from`` take from it or add to it.

Files are always opened with ``weights_only=True`` (plain tensors and containers, never code), so
anything stored here must be tensors, numbers, strings, lists or dicts.
"""

from __future__ import annotations

import pickle
import random
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..models.pickles import refused_pickle
from ..record import TORCHSCRIPT_FILE, WEIGHTS_FILE, checkpoint_entry

LAST = "last.ckpt"
CHECKPOINT_FILE = "a train.py checkpoint file such as <run dir>/checkpoints/last.ckpt"
ZIP_MAGIC = b"PK\x03\x04"  # torch.save writes zip archives


def read_checkpoint(path: str | Path, key: str = "checkpoint") -> dict[str, Any]:
    """A checkpoint's contents on the CPU, tensors memory-mapped (reading only a large file's metadata stays
    cheap). A missing, empty, truncated or foreign file, or one that is not a Lightning checkpoint, is an
    error naming ``key`` (``ckpt_path``, ``init_from``), the path and what was expected."""
    path = Path(path)
    if path.is_dir():
        raise wrong_kind(key, path, CHECKPOINT_FILE)
    if not path.is_file():
        raise FileNotFoundError(f"{key}={path}: no such checkpoint file")
    size = path.stat().st_size
    with path.open("rb") as handle:
        head = handle.read(4)
    if head != ZIP_MAGIC:
        what = "an empty file" if size == 0 else f"a file of {size} bytes starting with {head!r}"
        hint = (
            f"; an exported model is opened by its folder: {key}={path.parent}"
            if path.suffix == ".safetensors" and key == "checkpoint"
            else ""
        )
        raise ValueError(
            f"{key}={path}: not a segattn/Lightning checkpoint: {what}; expected a torch.save zip archive "
            f"such as <run dir>/checkpoints/last.ckpt{hint}"
        )
    if not zipfile.is_zipfile(path):
        raise ValueError(
            f"{key}={path}: truncated checkpoint: {size} bytes, the end of the archive is missing (a copy or "
            "transfer that stopped early?); copy it again or use another checkpoint of the run"
        )
    if is_torchscript(path):
        raise wrong_kind(key, path, CHECKPOINT_FILE)
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as error:
        raise refused_pickle(key, path, error) from None
    except RuntimeError as error:
        raise ValueError(
            f"{key}={path}: unreadable checkpoint: {' '.join(str(error).split())[:300]}"
        ) from None
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), dict):
        raise ValueError(
            f"{key}={path}: not a segattn/Lightning checkpoint: no 'state_dict' entry "
            f"(found {type(checkpoint).__name__}); expected a checkpoint written by train.py"
        )
    return checkpoint


def is_torchscript(path: Path) -> bool:
    """Whether ``path`` is a TorchScript module (a zip archive holding ``code/``, as ``torch.jit.save``
    writes) or a folder holding ``model.pt`` and no safetensors export."""
    if path.is_dir():
        return (path / TORCHSCRIPT_FILE).is_file() and not (path / WEIGHTS_FILE).is_file()
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        return any(name.split("/")[1:2] == ["code"] for name in archive.namelist())


def other_model_kind(key: str, path: Path) -> str | None:
    """What ``path`` given as ``key`` is, with what to give instead, when it is a train.py run folder or a
    TorchScript export (its model.pt or its folder); None for anything else."""
    if path.is_dir() and ((path / "checkpoints").is_dir() or (path / ".hydra").is_dir()):
        best = path / "checkpoints" / "best.ckpt"
        return f"a train.py run folder; give one of its checkpoints: {key}={best} (or last.ckpt)"
    if is_torchscript(path):
        return (
            "a TorchScript export, which eval and predict run but training cannot start from; give the "
            "checkpoint it was exported from"
        )
    return None


def wrong_kind(key: str, path: Path, expected: str) -> ValueError:
    """The error for ``key=path`` where ``path`` is another kind of thing than ``expected``, named for what
    it is (``other_model_kind``, a safetensors export folder, or another folder)."""
    what = other_model_kind(key, path)
    if what is None:
        what = "a safetensors export folder" if (path / WEIGHTS_FILE).is_file() else "a folder"
    return ValueError(f"{key}={path}: {what}; expected {expected}")


def find_last_checkpoint(log_dir: str | Path, exclude: str | Path | None = None) -> Path | None:
    """The most recently modified ``last.ckpt`` under ``log_dir`` (runs and sweeps alike), ignoring files
    under ``exclude``. Checkpoints have no version suffixes (``enable_version_counter: false``), so a run's
    latest state is always ``last.ckpt``."""
    excluded = Path(exclude).resolve() if exclude else None
    candidates = [
        path
        for path in Path(log_dir).rglob(LAST)
        if path.is_file() and not (excluded and path.resolve().is_relative_to(excluded))
    ]
    return max(candidates, key=lambda path: path.stat().st_mtime, default=None)


def resolve_ckpt_path(ckpt_path: str | None, log_dir: str | Path, run_dir: str | Path) -> Path | None:
    """``ckpt_path`` from the config → the checkpoint file to resume from (None: start fresh).

    ``auto`` resumes the run's own ``last.ckpt`` when it has one and starts fresh otherwise: one command
    for the first launch and every requeue of a job with a fixed run directory. ``last`` also looks in
    the run's own directory first (a requeued job re-run into ``hydra.run.dir``), then takes the newest
    ``last.ckpt`` of other runs under ``log_dir``. Anything else is a path.
    """
    if ckpt_path is None:
        return None
    if ckpt_path in ("auto", "last"):
        own = find_last_checkpoint(run_dir) if Path(run_dir).is_dir() else None
        if own is not None or ckpt_path == "auto":
            return own
        found = find_last_checkpoint(log_dir, exclude=run_dir)
        if found is None:
            raise FileNotFoundError(
                f"ckpt_path=last: no {LAST} in this run's directory {run_dir} nor under {log_dir}; "
                "train once first, pass a path, or use ckpt_path=auto to start fresh when there is none"
            )
        return found
    path = Path(ckpt_path).expanduser()
    if path.is_dir():
        raise wrong_kind("ckpt_path", path, CHECKPOINT_FILE)
    if not path.is_file():
        raise FileNotFoundError(f"ckpt_path={ckpt_path}: no such checkpoint file")
    return path


def nothing_left_to_train(checkpoint: dict[str, Any], max_epochs: int | None, max_steps: int) -> str | None:
    """Why resuming ``checkpoint`` would train no step under ``trainer.max_epochs`` / ``max_steps`` (the
    limit it has already reached, as Lightning's fit loop decides), or None when there is training left."""
    step = int(checkpoint.get("global_step", 0))
    if max_steps >= 0 and step >= max_steps:
        return f"the checkpoint is at step {step}, trainer.max_steps={max_steps}"
    if max_epochs is None:  # Lightning's default: 1000 epochs unless max_steps limits the run
        max_epochs = 1000 if max_steps == -1 else -1
    loops = checkpoint.get("loops") or {}
    epochs = loops.get("fit_loop", {}).get("epoch_progress", {}).get("current", {}).get("processed")
    if isinstance(epochs, int) and max_epochs >= 0 and epochs >= max_epochs:
        return f"the checkpoint has finished {epochs} epoch(s) (step {step}), trainer.max_epochs={max_epochs}"
    return None


def wandb_run_id(checkpoint: dict[str, Any]) -> str | None:
    """The W&B run id stored by training, so a resumed run continues the same W&B run."""
    return checkpoint_entry(checkpoint, "wandb_run_id")


def load_weights(model: nn.Module, path: str | Path, prefix: str = "model.") -> dict[str, list[str]]:
    """Copy the weights of a Lightning checkpoint into ``model`` (fine-tuning; no optimizer state).

    Tensors whose shape differs (e.g. a head for another number of classes) are skipped. Returns the
    ``loaded``, ``skipped``, ``missing`` and ``unexpected`` key names.
    """
    state = read_checkpoint(path, "init_from")["state_dict"]
    weights = {key[len(prefix) :]: value for key, value in state.items() if key.startswith(prefix)}
    own = model.state_dict()
    skipped = sorted(key for key, value in weights.items() if key in own and own[key].shape != value.shape)
    matching = {key: value for key, value in weights.items() if key not in skipped}
    result = model.load_state_dict(matching, strict=False)
    loaded = sorted(set(matching) - set(result.unexpected_keys))
    if not loaded:
        raise ValueError(f"init_from={path}: no tensor matches the model (checkpoint keys under {prefix!r})")
    return {
        "loaded": loaded,
        "skipped": skipped,
        "missing": sorted(result.missing_keys),
        "unexpected": sorted(result.unexpected_keys),
    }


def rng_state() -> dict[str, Any]:
    """The global torch / numpy / Python RNG states as tensors and numbers (safe to unpickle)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
        "python": random.getstate(),
    }


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of ``rng_state``: resuming continues the same random stream (augmentations, shuffling)."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
