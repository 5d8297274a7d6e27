"""Does a checkpoint fit the model a run asks for? Compares the ``build_model`` config of the checkpoint's
record (``ModelRecord.from_checkpoint``) with the requested one, before anything is restored.

Parameter shapes alone cannot tell: a ``linear`` checkpoint loads into a ``taylor`` model without a single
mismatch and would train on silently as the other variant. Resuming requires the same architecture;
``init_from`` may change it (typically the class count, which replaces the head) and only reports it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import FileFormatError
from ..record import ModelRecord

# build_model options that say how to train, not what is built: they may change between runs.
TRAINING_OPTIONS = frozenset(
    {
        "pretrained",
        "grad_checkpointing",
        "dropout",
        "drop_path_rate",
        "aux_weight",
        "head_lr_mult",
        "layer_decay",
    }
)


def config_key(option: str) -> str:
    """The config key a user sets for a ``build_model`` option."""
    return {"attention": "attention", "num_classes": "data.num_classes (class count)"}.get(
        option, f"model.{option}"
    )


def architecture_differences(recorded: dict[str, Any], requested: dict[str, Any]) -> list[str]:
    """``key=<checkpoint's> vs <requested>`` for every architecture option set on both sides that differs;
    attention options are compared one by one (``attention.options.<name>``)."""
    differences = []
    for option in sorted((recorded.keys() & requested.keys()) - TRAINING_OPTIONS):
        old, new = recorded[option], requested[option]
        if option == "attention_options":
            old, new = old or {}, new or {}
            differences += [
                f"attention.options.{name}={old.get(name)} vs {new.get(name)}"
                for name in sorted(old.keys() | new.keys())
                if old.get(name) != new.get(name)
            ]
        elif _plain(old) != _plain(new):
            differences.append(f"{config_key(option)}={_plain(old)} vs {_plain(new)}")
    return differences


def check_resumable(checkpoint: dict[str, Any], requested: dict[str, Any], path: str | Path) -> None:
    """Refuse to resume ``path`` into a model built differently, naming both values of each difference."""
    try:
        recorded = ModelRecord.from_checkpoint(checkpoint, path, "ckpt_path").model
    except FileFormatError as error:
        raise FileFormatError(f"{error} (use init_from= to start from its weights)", path) from None
    differences = architecture_differences(recorded, requested)
    if differences:
        raise ValueError(
            f"ckpt_path={path}: the checkpoint was trained with a different model (checkpoint vs this run): "
            f"{'; '.join(differences)}. Resume with the checkpoint's settings, or start a new run from its "
            f"weights with init_from={path}"
        )


def describe_init_differences(checkpoint: dict[str, Any], requested: dict[str, Any]) -> str:
    """For ``init_from``: the architecture differences, as a clause of the report (empty when none)."""
    try:  # a checkpoint without a readable record: its weights are still reported tensor by tensor
        recorded = ModelRecord.from_checkpoint(checkpoint, "init_from").model
    except FileFormatError:
        return ""
    differences = architecture_differences(recorded, requested)
    if not differences:
        return ""
    return f"the checkpoint differs from this model (checkpoint vs this run): {'; '.join(differences)}; "


def _plain(value: Any) -> Any:
    """Tuples and lists compare alike (a config list vs a dataclass tuple default)."""
    return list(value) if isinstance(value, tuple) else value
