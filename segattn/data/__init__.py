"""Datasets in their official layouts, label lookup tables, albumentations pipelines, the data module
and the dataset scan the data doctor prints."""

from ..images import IGNORE_INDEX, IMAGENET_MEAN, IMAGENET_STD, DataError
from .base import DataSource, FileLayout, Sample, SegDataset, SegDatasetBase
from .datamodule import SegDataModule, seg_collate
from .labels import ColorMap, LabelMap
from .registry import DATASET_REGISTRY, available_datasets, build_dataset, build_source, dataset_options
from .scan import SplitReport, scan_dataset
from .synthetic import SyntheticDataset
from .transforms import (
    CatMaxRatioCrop,
    RandomResize,
    build_eval_transform,
    build_train_transform,
)

__all__ = [
    "DATASET_REGISTRY",
    "IGNORE_INDEX",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "CatMaxRatioCrop",
    "ColorMap",
    "DataError",
    "DataSource",
    "FileLayout",
    "LabelMap",
    "RandomResize",
    "Sample",
    "SegDataModule",
    "SegDataset",
    "SegDatasetBase",
    "SplitReport",
    "SyntheticDataset",
    "available_datasets",
    "build_dataset",
    "build_eval_transform",
    "build_source",
    "build_train_transform",
    "dataset_options",
    "scan_dataset",
    "seg_collate",
]
