"""``python -m segattn.doctor data=<name> data.root=<path> [data.<key>=<value> ...]``

Composes the same Hydra config as train.py, reads every file of the train/val/test splits, prints
counts, image sizes and the label histogram per class, then lists every problem found (unreadable or
truncated files, image/mask size mismatches, missing masks, unknown label values, 0/255 binary masks,
empty splits) and what train.py's checks of the training images refuse (``training.preflight.train_sizes``:
whole images of mixed sizes at a batch size above 1, images ``data.downsample`` does not divide). Exit
status: 0 clean, 1 problems found, 2 the configuration itself is wrong.

The command (composing the config, the one-line errors) lives here with the other commands; the scan and
the report it prints are ``segattn.data.scan``'s, so the data package imports nothing from the commands.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig

from .cli import compose_command, run_command
from .config import plain
from .data.datamodule import SegDataModule
from .data.scan import format_report, scan_splits
from .images import DataError
from .training.preflight import train_sizes

GROUPS = ("data", "paths")  # what the doctor reads; other overrides are reported and skipped


def doctor_overrides(overrides: Sequence[str]) -> list[str]:
    """The ``data`` / ``paths`` overrides of a command line; others (a pasted train.py command line) are
    reported on stderr and skipped, so the doctor runs even when other config groups are broken."""
    kept = []
    for override in overrides:
        key = override.lstrip("+~").partition("=")[0].split(".")[0]
        if key in GROUPS or override in ("--help", "-h"):
            kept.append(override)
        else:
            print(f"data doctor: ignoring {override!r} (only data and paths settings apply)", file=sys.stderr)
    return kept


def compose_data_config(overrides: Sequence[str]) -> dict[str, Any]:
    """``cfg.data`` of conf/doctor.yaml with ``overrides``, as plain SegDataModule kwargs: the data config
    a training run with the same overrides gets."""
    return plain(compose_command("doctor", overrides).data)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m segattn.doctor`` / ``segattn-doctor``: compose conf/doctor.yaml with the ``data`` /
    ``paths`` overrides of ``argv``; returns the exit status."""
    overrides = doctor_overrides(sys.argv[1:] if argv is None else argv)
    return run_command("data doctor", "doctor", run, overrides, groups=GROUPS[:1])


def run(cfg: DictConfig) -> int:
    """Scan every split; 0 clean, 1 problems found, 2 a dataset that cannot be set up."""
    kwargs = plain(cfg.data)  # composed by run_command
    try:
        datamodule = SegDataModule(**kwargs)
    except ValueError as err:
        print(f"data doctor: configuration error: {err}", file=sys.stderr)
        return 2
    reports = scan_splits(datamodule)
    refused = training_refusal(datamodule)
    if refused is not None:
        next(r for r in reports if r.split == datamodule.splits["train"]).problems.append(refused)
    print(format_report(datamodule, kwargs.get("root"), reports))
    return 1 if any(r.problems for r in reports) else 0


def training_refusal(datamodule: SegDataModule) -> str | None:
    """What train.py would refuse in this configuration's training images before training
    (``train_sizes``), or None; unreadable files are left to the scan, which names each."""
    try:
        train_sizes(datamodule)
    except DataError:
        return None
    except ValueError as error:
        return str(error)
    return None


if __name__ == "__main__":
    sys.exit(main())
