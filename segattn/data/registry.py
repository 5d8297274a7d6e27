"""Dataset names → families, and the builders that turn (name, root, options) into sources and datasets."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from .ade20k import ADE20KLayout
from .base import DataSource, SegDatasetBase, Transform
from .cityscapes import CityscapesLayout
from .folder import CamVidLayout, FolderLayout, IDRiDLayout
from .raster import RasterLayout
from .synthetic import SyntheticSource
from .voc import VOCLayout

DATASET_REGISTRY: dict[str, type[DataSource]] = {
    "synthetic": SyntheticSource,
    "camvid": CamVidLayout,
    "folder": FolderLayout,
    "idrid": IDRiDLayout,
    "ade20k": ADE20KLayout,
    "cityscapes": CityscapesLayout,
    "voc": VOCLayout,
    "raster": RasterLayout,
}


def available_datasets() -> list[str]:
    """Names accepted by ``build_dataset`` and ``data=<name>``."""
    return sorted(DATASET_REGISTRY)


def dataset_options(name: str) -> list[str]:
    """Family-specific options of dataset ``name`` (constructor arguments beyond root)."""
    params = inspect.signature(_family(name).__init__).parameters
    return [p for p in params if p not in ("self", "root")]


def build_source(name: str, root: str | Path | None = None, **options: Any) -> DataSource:
    """The dataset family ``name`` bound to ``root``; unknown names or options raise a ValueError."""
    family = _family(name)
    unknown = sorted(set(options) - set(dataset_options(name)))
    if unknown:
        valid = ", ".join(dataset_options(name)) or "none"
        raise ValueError(f"dataset {name!r} has no option(s) {unknown}; its options are: {valid}")
    if root is None and name != "synthetic":
        raise ValueError(f"dataset {name!r} needs data.root (the folder holding its files)")
    return family(root, **options)


def build_dataset(
    name: str, root: str | Path | None, split: str, transform: Transform | None = None, **options: Any
) -> SegDatasetBase:
    """The ``split`` of dataset ``name`` under ``root``; without a transform, items are full-resolution and
    ImageNet-normalised."""
    return build_source(name, root, **options).dataset(split, transform)


def _family(name: str) -> type[DataSource]:
    try:
        return DATASET_REGISTRY[name]
    except KeyError:
        valid = ", ".join(available_datasets())
        raise ValueError(f"unknown dataset {name!r}; expected one of: {valid}") from None
