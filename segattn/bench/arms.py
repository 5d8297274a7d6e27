"""The arms of an accuracy table, read from its experiment file instead of written in Python, and each
arm as the Hydra overrides of its training run.

An experiment under conf/experiment/ may end with a ``table`` section: ``seeds`` and ``arms``, each arm a
label and the Hydra overrides that make it (conf/experiment/idrid_resolution_cpu.yaml). ``bench accuracy
--experiment <name>`` trains one run per arm and seed; the same overrides train one arm by hand.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import yaml

from ..attention import attention_class, attention_options, available_attention
from .specs import Spec


@dataclass(frozen=True)
class Table:
    """The arms and seeds an experiment file lists under ``table``: one ``Spec`` per arm, named by its
    label, built from its Hydra overrides."""

    arms: list[Spec]
    seeds: list[int]

    def select(self, labels: list[str] | None, experiment: str) -> list[Spec]:
        """The arms named by ``labels`` (``arms=``), in the table's order; all of them without labels.
        A label the table lacks is refused, naming the ones it has."""
        if not labels:
            return list(self.arms)
        known = [arm.label for arm in self.arms]
        unknown = [label for label in labels if label not in known]
        if unknown:
            raise ValueError(
                f"arms={','.join(unknown)}: not an arm of experiment {experiment}; expected among "
                f"{', '.join(known)}"
            )
        return [arm for arm in self.arms if arm.label in labels]


def experiment_table(experiment: str, overrides: list[str]) -> Table | None:
    """``table.arms`` ({label: [overrides]}) and ``table.seeds`` of the composed experiment; None without a
    ``table``. Each arm needs one ``attention=<name>``; its other overrides are run overrides (dotted keys
    such as ``data.downsample=2``) or attention options, as in a ``--variants`` spec."""
    from ..cli import compose_command

    cfg = compose_command("train", [f"experiment={experiment}", *overrides])
    table = cfg.get("table")
    if table is None:
        return None
    arms = []
    for label, arm_overrides in table.arms.items():
        options: dict[str, Any] = {}
        for override in arm_overrides:
            key, sep, value = str(override).partition("=")
            if not sep:
                raise ValueError(
                    f"experiment {experiment}: table.arms.{label}: {override!r} is not key=value"
                )
            options[key] = yaml.safe_load(value)
        name = options.pop("attention", None)
        if name not in available_attention():
            raise ValueError(
                f"experiment {experiment}: table.arms.{label}: attention={name}; expected one of "
                f"{', '.join(available_attention())}"
            )
        arms.append(Spec(str(name), options, str(label)))
    return Table(arms, [int(seed) for seed in table.seeds])


CONFIG_GROUPS = ("model", "data", "loss", "optimizer", "scheduler", "trainer", "inference", "metrics")


def is_run_override(key: str) -> bool:
    """Whether a spec option is a plain Hydra override of the run (``data.downsample``, ``model``) rather
    than an option of the attention or the model."""
    return "." in key or key in CONFIG_GROUPS


def run_overrides(variant: Spec) -> list[str]:
    """The spec's plain Hydra overrides: ``data.downsample=4``, ``model=efficientvit``."""
    return [
        f"{key}={value if isinstance(value, str) else json.dumps(value)}"
        for key, value in variant.options.items()
        if is_run_override(key)
    ]


def spec_overrides(variant: Spec) -> list[str]:
    """``attention=<name>`` plus each option as an attention or a model override (``sr_ratios`` is PVT's),
    or as itself where it names a config key or group (``run_overrides``)."""
    accepted = set(attention_options(variant.name))
    overrides = [f"attention={variant.name}", *run_overrides(variant)]
    for key, value in variant.options.items():
        if is_run_override(key):
            continue
        key = f"++attention.options.{key}" if key in accepted else f"model.{key}"
        overrides.append(f"{key}={json.dumps(value)}")
    if not attention_class(variant.name).onnx_dynamic:
        # Tied to a token count: evaluate by sliding the training crop over the image, its trained size, at
        # the default stride for that window (a preset's stride may be wider than it)
        overrides += ["inference.mode=slide", "inference.crop=${data.crop_size}", "inference.stride=null"]
    return overrides
