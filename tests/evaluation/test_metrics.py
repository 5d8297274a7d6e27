"""SegmentationMetric against mIoU / mAcc / aAcc computed by hand on a planted example."""

import math

import pytest
import torch

from segattn.evaluation.metrics import SegmentationMetric

IGN = 255

# Two updates of different sizes. Class 3 appears in neither label nor (valid) prediction; the
# prediction 3 in image A sits on an ignored pixel and must not count.
TARGET_A = [[0, 0, 1, IGN], [1, 1, 2, IGN]]
PRED_A = [[0, 1, 1, 3], [1, 0, 2, 0]]
TARGET_B = [[2, 2, 2], [0, 0, IGN]]
PRED_B = [[2, 2, 0], [0, 1, 3]]

# By hand over both images (valid pixels only):
#   label  counts: c0=4, c1=3, c2=4, c3=0     (11 pixels)
#   pred   counts: c0=4, c1=4, c2=3, c3=0
#   intersection : c0=2, c1=2, c2=3, c3=0     (7 pixels)
#   union        : c0=6, c1=5, c2=4, c3=0 -> IoU c3 undefined (NaN), left out of the mean
EXPECTED_IOU = [2 / 6, 2 / 5, 3 / 4]
EXPECTED_ACC = [2 / 4, 2 / 3, 3 / 4]
EXPECTED_AACC = 7 / 11


def planted_scores(metric: SegmentationMetric) -> dict:
    metric.update(torch.tensor([PRED_A]), torch.tensor([TARGET_A]))
    metric.update(torch.tensor([PRED_B]), torch.tensor([TARGET_B]))
    return metric.compute()


def test_metric_matches_hand_computed_scores():
    scores = planted_scores(SegmentationMetric(num_classes=4, ignore_index=IGN))
    assert scores["mIoU"].item() == pytest.approx(100 * sum(EXPECTED_IOU) / 3)  # 49.444
    assert scores["mAcc"].item() == pytest.approx(100 * sum(EXPECTED_ACC) / 3)  # 63.889
    assert scores["aAcc"].item() == pytest.approx(100 * EXPECTED_AACC)  # 63.636
    iou = scores["IoU"].tolist()
    assert iou[:3] == pytest.approx([100 * v for v in EXPECTED_IOU])
    assert math.isnan(iou[3])


def test_metric_reset_and_perfect_prediction():
    metric = SegmentationMetric(num_classes=4, ignore_index=IGN)
    planted_scores(metric)
    metric.reset()
    target = torch.tensor([TARGET_A])
    metric.update(target.masked_fill(target == IGN, 0), target)  # ignored pixels predicted as anything
    scores = metric.compute()
    assert scores["mIoU"].item() == pytest.approx(100.0)
    assert scores["aAcc"].item() == pytest.approx(100.0)


def test_metric_rejects_labels_outside_the_classes():
    metric = SegmentationMetric(num_classes=3, ignore_index=IGN)
    with pytest.raises(ValueError, match=r"\[7\]"):
        metric.update(torch.zeros(1, 2, 2, dtype=torch.long), torch.tensor([[[0, 7], [1, IGN]]]))
