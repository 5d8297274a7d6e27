"""Read every file of a dataset once and report counts, sizes, the label histogram and every problem: what
the data doctor (``python -m segattn.doctor``) prints, and what the data module checks with
``data.validate=true``."""

from __future__ import annotations

import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..images import DataError
from .base import SegDatasetBase

if TYPE_CHECKING:
    from .datamodule import SegDataModule


@dataclass
class SplitReport:
    """What a scan of one split found; ``histogram[k]`` counts pixels of class k, ``ignored`` the rest."""

    split: str
    count: int = 0
    sizes: Counter = field(default_factory=Counter)  # (width, height) -> number of images
    histogram: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    ignored: int = 0
    problems: list[str] = field(default_factory=list)


def _check(
    dataset: SegDatasetBase, index: int
) -> tuple[tuple[int, int] | None, np.ndarray | None, list[str]]:
    """(image size, train-id counts, problems) of one sample; image and mask are checked independently."""
    problems, image, mask = [], None, None
    try:
        image = dataset.load_image(index)
    except DataError as err:
        problems.append(str(err))
    try:
        mask = dataset.load_mask(index)
    except DataError as err:
        problems.append(str(err))
    if image is not None and mask is not None:
        try:
            dataset.check_sizes(index, image, mask)
        except DataError as err:
            problems.append(str(err))
            mask = None
    size = None if image is None else (image.shape[1], image.shape[0])
    counts = None if mask is None else np.bincount(mask.ravel(), minlength=256)
    return size, counts, problems


def scan_dataset(dataset: SegDatasetBase, split: str = "", workers: int | None = None) -> SplitReport:
    """Check every sample of ``dataset`` (threads: decoding releases the GIL)."""
    report = SplitReport(split, len(dataset), histogram=np.zeros(len(dataset.classes), dtype=np.int64))
    workers = workers or min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(workers) as pool:
        for size, counts, problems in pool.map(lambda i: _check(dataset, i), range(len(dataset))):
            if size is not None:
                report.sizes[size] += 1
            if counts is not None:
                report.histogram += counts[: len(dataset.classes)]
                report.ignored += int(counts[dataset.ignore_index])
            report.problems += problems
    return report


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
