"""mmseg-compatible segmentation metrics accumulated over a whole evaluation set.

Only per-class pixel counts are kept (never logits or masks), summed across ranks under DDP, so the
scores of a distributed run equal those of a single process on the same predictions.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric


class SegmentationMetric(Metric):
    """Per-class intersection / union / prediction / label pixel counts → mIoU, mAcc, aAcc in percent.

    Definitions follow mmseg's ``IoUMetric``: pixels whose label is ``ignore_index`` are dropped;
    IoU_c = I_c / U_c, Acc_c = I_c / L_c; a class whose union (resp. label count) is zero gets NaN and
    is left out of the mean; aAcc = ΣI / ΣL.
    """

    full_state_update = False

    def __init__(self, num_classes: int, ignore_index: int = 255) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.ignore_index = ignore_index
        for name in ("area_intersect", "area_union", "area_pred", "area_label"):
            self.add_state(name, torch.zeros(num_classes, dtype=torch.long), dist_reduce_fx="sum")

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
        intersect = torch.bincount(label[pred == label], minlength=k)
        area_pred = torch.bincount(pred, minlength=k)
        area_label = torch.bincount(label, minlength=k)
        self.area_intersect += intersect
        self.area_pred += area_pred
        self.area_label += area_label
        self.area_union += area_pred + area_label - intersect

    def compute(self) -> dict[str, Tensor]:
        """``mIoU``, ``mAcc``, ``aAcc`` (scalars) and per-class ``IoU``, ``Acc`` ([K], NaN when undefined)."""
        intersect = self.area_intersect.double()
        iou = intersect / self.area_union.double()  # 0/0 -> NaN: class absent from both
        acc = intersect / self.area_label.double()
        a_acc = intersect.sum() / self.area_label.sum().double()
        return {
            "mIoU": 100 * iou.nanmean(),
            "mAcc": 100 * acc.nanmean(),
            "aAcc": 100 * a_acc,
            "IoU": 100 * iou,
            "Acc": 100 * acc,
        }
