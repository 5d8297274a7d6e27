"""The per-class table (IoU, Acc, Dice, Precision, Recall) and the summary (mIoU, mAcc, aAcc, mDice,
fwIoU) against a confusion matrix computed by hand, with ignored pixels, a class absent from both the
prediction and the labels, and a class predicted but never labelled."""

import csv
import json
import math

import numpy as np
import pytest
import torch

from segattn.evaluation.metrics import SegmentationMetric
from segattn.evaluation.report import scores_record, write_per_class_csv
from segattn.files import write_json

IGN = 255
CLASSES = ["road", "car", "sky", "tree"]
# Class 2 (sky) is predicted twice but never labelled; class 3 (tree) is in neither; the 9 on an ignored
# pixel is not a class and must not count.
TARGET = [[0, 0, 0, 1], [1, 1, IGN, IGN]]
PRED = [[0, 1, 2, 1], [1, 2, 9, 0]]
# By hand, confusion[label, prediction] over the 6 valid pixels:
#   label 0: predicted 0, 1, 2      label 1: predicted 1, 1, 2
CONFUSION = [[1, 1, 1, 0], [0, 2, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
# I = (1, 2, 0, 0), L = (3, 3, 0, 0), P = (1, 3, 2, 0)
IOU = [1 / 3, 2 / 4, 0.0, math.nan]  # union 3, 4, 2, 0
ACC = [1 / 3, 2 / 3, math.nan, math.nan]
DICE = [2 / 4, 4 / 6, 0.0, math.nan]
PRECISION = [1 / 1, 2 / 3, 0.0, math.nan]


def planted() -> SegmentationMetric:
    metric = SegmentationMetric(num_classes=4, ignore_index=IGN)
    target = torch.tensor([TARGET])
    metric.update(torch.tensor([PRED]), target)
    return metric


def expect(values: list[float], actual: torch.Tensor) -> None:
    for want, got in zip(values, actual.tolist(), strict=True):
        assert (math.isnan(want) and math.isnan(got)) or got == pytest.approx(100 * want)


def test_confusion_and_per_class_scores_match_the_hand_computed_ones():
    metric = planted()
    assert metric.confusion.tolist() == CONFUSION
    scores = metric.compute()
    expect(IOU, scores["IoU"])
    expect(ACC, scores["Acc"])
    expect(ACC, scores["Recall"])
    expect(DICE, scores["Dice"])
    expect(PRECISION, scores["Precision"])
    # Means leave NaN classes out; the predicted-but-absent class counts with IoU 0 (as in mmseg).
    assert scores["mIoU"].item() == pytest.approx(100 * (1 / 3 + 1 / 2 + 0) / 3)
    assert scores["mAcc"].item() == pytest.approx(100 * (1 / 3 + 2 / 3) / 2)
    assert scores["mDice"].item() == pytest.approx(100 * (1 / 2 + 2 / 3 + 0) / 3)
    assert scores["aAcc"].item() == pytest.approx(100 * 3 / 6)
    assert scores["fwIoU"].item() == pytest.approx(100 * (3 / 6 * 1 / 3 + 3 / 6 * 1 / 2))


def test_report_files_hold_the_scores_with_undefined_ones_empty(tmp_path):
    metric = planted()
    record = scores_record(metric.compute(), metric.confusion.numpy(), CLASSES)
    write_json(tmp_path / "metrics.json", record)
    write_per_class_csv(record, tmp_path / "per_class.csv")
    loaded = json.loads((tmp_path / "metrics.json").read_text())  # standard JSON: no NaN literals
    assert loaded["per_class"]["tree"]["IoU"] is None and loaded["per_class"]["sky"]["IoU"] == 0.0
    assert loaded["per_class"]["car"]["pixels"] == 3
    assert loaded["summary"]["mIoU"] == pytest.approx(100 * (1 / 3 + 1 / 2) / 3)
    rows = list(csv.DictReader((tmp_path / "per_class.csv").open()))
    assert [row["class"] for row in rows] == CLASSES
    assert float(rows[1]["Dice"]) == pytest.approx(100 * 2 / 3, abs=1e-4)
    assert rows[3]["IoU"] == "" and rows[2]["Recall"] == ""
    assert np.isclose(float(rows[0]["Precision"]), 100.0)
