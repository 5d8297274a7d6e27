"""Read every file of a dataset once and report counts, sizes, the label histogram and every problem."""

from __future__ import annotations

import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from ..images import DataError
from .base import SegDatasetBase


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
