"""mmseg-compatible segmentation metrics accumulated over a whole evaluation set.

Only the K × K confusion matrix of pixel counts is kept (never logits or masks), summed across ranks
under DDP, so the scores of a distributed run equal those of a single process on the same predictions.
Validation, the test step and ``eval.py`` all score with this one class.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric

SUMMARY_KEYS = ("mIoU", "mAcc", "aAcc", "mDice", "fwIoU")
PER_CLASS_KEYS = ("IoU", "Acc", "Dice", "Precision", "Recall")


def scores_from_confusion(confusion: Tensor) -> dict[str, Tensor]:
    """Scores in percent from ``confusion[label, prediction]`` pixel counts.

    Per class c, with I = confusion[c, c], L = row sum (label pixels), P = column sum (predicted pixels):
    IoU = I / (L + P − I), Acc = Recall = I / L, Precision = I / P, Dice = 2I / (L + P). A ratio whose
    denominator is zero is NaN and left out of its mean, as in mmseg's ``IoUMetric``: a class absent from
    both prediction and labels has no IoU, a class predicted but never labelled has IoU 0 (it counts).
    aAcc = ΣI / ΣL; fwIoU = Σ_c (L_c / ΣL) · IoU_c.
    """
    counts = confusion.double()
    intersect = counts.diagonal()
    area_label, area_pred = counts.sum(1), counts.sum(0)
    iou = intersect / (area_label + area_pred - intersect)  # 0/0 -> NaN: class absent from both
    acc = intersect / area_label
    frequency = area_label / area_label.sum()
    return {
        "mIoU": 100 * iou.nanmean(),
        "mAcc": 100 * acc.nanmean(),
        "aAcc": 100 * intersect.sum() / area_label.sum(),
        "mDice": 100 * (2 * intersect / (area_label + area_pred)).nanmean(),
        "fwIoU": 100 * (frequency * iou).nansum(),
        "IoU": 100 * iou,
        "Acc": 100 * acc,
        "Dice": 100 * 2 * intersect / (area_label + area_pred),
        "Precision": 100 * intersect / area_pred,
        "Recall": 100 * acc,
    }


class SegmentationMetric(Metric):
    """A confusion matrix of valid pixels → the scores of ``scores_from_confusion`` (percent).

    Pixels whose label is ``ignore_index`` are dropped; any other label outside 0..K−1 is an error.
    """

    full_state_update = False

    def __init__(self, num_classes: int, ignore_index: int = 255) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.ignore_index = ignore_index
        self.add_state("confusion", torch.zeros(num_classes, num_classes, dtype=torch.long), "sum")

    def update(self, preds: Tensor, target: Tensor) -> None:
        """Add a batch of predicted class ids and labels (same shape, e.g. [B, H, W])."""
        if preds.shape != target.shape:
            raise ValueError(f"preds {list(preds.shape)} and target {list(target.shape)} differ in shape")
        valid = target != self.ignore_index
        label = target[valid].long()
        pred = preds[valid].long()
        bad = label[(label < 0) | (label >= self.num_classes)]
        if bad.numel():
            raise ValueError(
                f"labels {sorted(bad.unique().tolist())[:10]} are outside 0..{self.num_classes - 1} and are "
                f"not the ignore index {self.ignore_index}"
            )
        k = self.num_classes
        self.confusion += torch.bincount(label * k + pred, minlength=k * k).view(k, k)

    def compute(self) -> dict[str, Tensor]:
        """Scalars ``SUMMARY_KEYS`` and per-class [K] tensors ``PER_CLASS_KEYS`` (NaN when undefined)."""
        return scores_from_confusion(self.confusion)
