"""``python -m segattn.data.doctor data=<name> data.root=<path> [data.<key>=<value> ...]``

Composes the same Hydra config as train.py, reads every file of the train/val/test splits, prints
counts, image sizes and the label histogram per class, then lists every problem found (unreadable or
truncated files, image/mask size mismatches, missing masks, unknown label values, 0/255 binary masks,
empty splits). Exit status: 0 clean, 1 problems found, 2 the configuration itself is wrong.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ..cli import compose_command, run_command
from ..images import DataError
from .datamodule import SegDataModule
from .scan import SplitReport, scan_dataset

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
    return OmegaConf.to_container(compose_command("doctor", overrides).data, resolve=True)


def scan_splits(datamodule: SegDataModule) -> list[SplitReport]:
    """One report per distinct split name of the data module (train, val, test)."""
    reports = []
    for split in dict.fromkeys(datamodule.splits.values()):
        try:
            dataset = datamodule.source.dataset(split)
        except (DataError, ValueError) as err:
            reports.append(SplitReport(split, problems=[str(err)]))
            continue
        reports.append(scan_dataset(dataset, split))
    return reports


def _sizes(report: SplitReport) -> str:
    common = [f"{w}x{h} ({n})" for (w, h), n in report.sizes.most_common(3)]
    others = len(report.sizes) - len(common)
    if others:
        areas = sorted(report.sizes, key=lambda s: s[0] * s[1])
        common.append(f"+{others} other sizes, {areas[0][0]}x{areas[0][1]} to {areas[-1][0]}x{areas[-1][1]}")
    return ", ".join(common) or "-"


def format_report(datamodule: SegDataModule, root: Any, reports: list[SplitReport]) -> str:
    """The doctor's printout: header, per-split counts and sizes, histogram table, problems."""
    dm = datamodule
    lines = [f"dataset {dm.name!r} at {root}: {dm.num_classes} classes, ignore index {dm.ignore_index}", ""]
    lines.append(f"{'split':<12}{'samples':>8}  image sizes (W x H)")
    lines += [f"{r.split:<12}{r.count:>8}  {_sizes(r)}" for r in reports]
    width = max(len(c) for c in dm.classes) + 2
    lines += ["", "label histogram, % of labelled pixels:", f"{'id':>4}  {'class':<{width}}"]
    lines[-1] += "".join(f"{r.split:>10}" for r in reports)
    for k, name in enumerate(dm.classes):
        cells = [
            r.histogram[k] / max(1, r.histogram.sum()) * 100 if r.histogram.size else 0.0 for r in reports
        ]
        lines.append(f"{k:>4}  {name:<{width}}" + "".join(f"{c:>9.2f}%" for c in cells))
    totals = [int(r.histogram.sum()) + r.ignored for r in reports]
    lines.append(
        f"{'':>4}  {'labelled px':<{width}}" + "".join(f"{int(r.histogram.sum()):>10}" for r in reports)
    )
    lines.append(
        f"{'':>4}  {f'ignored ({dm.ignore_index})':<{width}}"
        + "".join(f"{r.ignored / max(1, t) * 100:>9.2f}%" for r, t in zip(reports, totals, strict=True))
        + "  of all pixels"
    )
    problems = [p for r in reports for p in r.problems]
    lines += ["", f"{len(problems)} problem(s):" if problems else "no problems found"]
    lines += [f"  - {p}" for p in problems]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m segattn.data.doctor`` / ``segattn-doctor``: compose conf/doctor.yaml with the ``data`` /
    ``paths`` overrides of ``argv``; returns the exit status."""
    overrides = doctor_overrides(sys.argv[1:] if argv is None else argv)
    return run_command("data doctor", "doctor", run, overrides, groups=GROUPS[:1])


def run(cfg: DictConfig) -> int:
    """Scan every split; 0 clean, 1 problems found, 2 a dataset that cannot be set up."""
    kwargs = OmegaConf.to_container(cfg.data, resolve=True)  # composed by run_command
    try:
        datamodule = SegDataModule(**kwargs)
    except ValueError as err:
        print(f"data doctor: configuration error: {err}", file=sys.stderr)
        return 2
    reports = scan_splits(datamodule)
    print(format_report(datamodule, kwargs.get("root"), reports))
    return 1 if any(r.problems for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
