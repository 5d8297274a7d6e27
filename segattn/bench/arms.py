"""The arms of an accuracy table, read from its experiment file instead of written in Python.

An experiment under conf/experiment/ may end with a ``table`` section: ``seeds`` and ``arms``, each arm a
label and the Hydra overrides that make it (conf/experiment/idrid_resolution_cpu.yaml). ``bench accuracy
--experiment <name>`` trains one run per arm and seed; the same overrides train one arm by hand.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from ..attention import available_attention
from .specs import Spec


@dataclass(frozen=True)
class Table:
    """The arms and seeds an experiment file lists under ``table``: one ``Spec`` per arm, named by its
    label, built from its Hydra overrides."""

    arms: list[Spec]
    seeds: list[int]

    def select(self, labels: list[str] | None, experiment: str) -> list[Spec]:
        """The arms named by ``labels`` (``--arms``), in the table's order; all of them without labels.
        A label the table lacks is refused, naming the ones it has."""
        if not labels:
            return list(self.arms)
        known = [arm.label for arm in self.arms]
        unknown = [label for label in labels if label not in known]
        if unknown:
            raise ValueError(
                f"--arms {' '.join(unknown)}: not an arm of experiment {experiment}; expected among "
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
