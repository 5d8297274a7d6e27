"""Per-class average precision (area under the precision-recall curve) from softmax probabilities.

Lesion segmentation (the IDRiD challenge, and most tasks whose classes cover a fraction of a percent of
the pixels) is scored by the area under each class's precision-recall curve instead of IoU at the argmax:
one threshold says little when a class is 0.1 % of the pixels. Memory stays bounded for any number of
pixels: each class keeps two histograms of ``bins`` probability bins (pixels of that class, pixels of
other classes), summed across batches and, under DDP, across ranks; a bin edge is a threshold.

AP is the step-wise area that scikit-learn's ``average_precision_score`` computes, Σ_t (R_t − R_{t+1})·P_t
over the thresholds from high to low, here with the bin edges as the thresholds. With every score on a bin
edge (probabilities that are multiples of 1/bins) it equals the exact per-pixel value; otherwise pixels that
share a bin are tied, which moves AP by at most the precision spread inside one bin.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import Metric

from .metrics import SegmentationMetric

DEFAULT_BINS = 1000


def average_precision_from_histograms(positives: Tensor, negatives: Tensor) -> Tensor:
    """AP in percent per class from ``[K, bins]`` counts of labelled / other pixels per score bin (bin b
    holds scores in [b/bins, (b+1)/bins)); NaN for a class without labelled pixels."""
    true_pos = positives.double().flip(-1).cumsum(-1)  # thresholds from the highest bin down
    false_pos = negatives.double().flip(-1).cumsum(-1)
    total = true_pos[:, -1:]
    predicted = true_pos + false_pos
    precision = torch.where(predicted > 0, true_pos / predicted.clamp(min=1), torch.ones_like(true_pos))
    recall = true_pos / total
    recall_step = torch.diff(recall, dim=-1, prepend=torch.zeros_like(recall[:, :1]))
    ap = (recall_step * precision).sum(-1)
    return 100 * torch.where(total.squeeze(-1) > 0, ap, torch.full_like(ap, float("nan")))


class AveragePrecisionMetric(Metric):
    """Per-class AP of softmax probabilities against labels, in bounded memory (module docstring).

    ``update(probs [B, K, H, W], target [B, H, W])``; labels equal to ``ignore_index`` are left out.
    ``compute()`` gives ``AP`` (per class, percent) and ``mAP``, the mean over ``mean_classes`` (class
    indices; default every class) of the classes that have labelled pixels.
    """

    full_state_update = False

    def __init__(
        self,
        num_classes: int,
        ignore_index: int = 255,
        bins: int = DEFAULT_BINS,
        mean_classes: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        if bins < 2:
            raise ValueError(f"average precision: bins={bins}; expected at least 2")
        self.num_classes, self.ignore_index, self.bins = num_classes, ignore_index, bins
        self.mean_classes = list(range(num_classes)) if mean_classes is None else list(mean_classes)
        bad = [c for c in self.mean_classes if not 0 <= c < num_classes]
        if bad or not self.mean_classes:
            raise ValueError(
                f"average precision: mean_classes={mean_classes}; expected ids in 0..{num_classes - 1}"
            )
        zeros = torch.zeros(num_classes, bins, dtype=torch.long)
        self.add_state("positives", zeros.clone(), "sum")
        self.add_state("negatives", zeros.clone(), "sum")

    def update(self, probs: Tensor, target: Tensor) -> None:
        """Add one batch: ``probs`` [B, K, H, W] (softmax over K), ``target`` [B, H, W] class ids."""
        if probs.dim() != 4 or probs.shape[1] != self.num_classes or probs.shape[2:] != target.shape[1:]:
            raise ValueError(
                f"average precision: probs {list(probs.shape)} and target {list(target.shape)}; expected "
                f"[B, {self.num_classes}, H, W] and [B, H, W]"
            )
        valid = target != self.ignore_index
        label = target[valid].long()
        for c in range(self.num_classes):
            scores = probs[:, c][valid]
            index = (scores.float() * self.bins).long().clamp_(0, self.bins - 1)
            is_class = label == c
            self.positives[c] += torch.bincount(index[is_class], minlength=self.bins)
            self.negatives[c] += torch.bincount(index[~is_class], minlength=self.bins)

    def compute(self) -> dict[str, Tensor]:
        """``AP`` [K] and ``mAP`` (percent; NaN where undefined)."""
        ap = average_precision_from_histograms(self.positives, self.negatives)
        return {"AP": ap, "mAP": ap[self.mean_classes].nanmean()}


def score_logits(
    logits: Tensor, masks: Tensor, metric: SegmentationMetric, ap: AveragePrecisionMetric
) -> Tensor:
    """Score logits [B, K, h, w] against ``masks`` [B, H, W]: argmax into ``metric``, softmax into ``ap``;
    returns the predicted ids [B, H, W]. Logits smaller than the masks (``data.downsample``) are resized
    bilinearly first. Validation, the test step and eval.py all score through here."""
    logits = logits.float()
    if logits.shape[-2:] != masks.shape[-2:]:
        logits = F.interpolate(logits, masks.shape[-2:], mode="bilinear", align_corners=False)
    preds = logits.argmax(dim=1)
    metric.update(preds, masks)
    ap.update(logits.softmax(dim=1), masks)
    return preds


def class_ids(names: Sequence[str] | str | None, classes: Sequence[str], key: str) -> list[int] | None:
    """Class indices of ``names``, or None for None; one name alone (``key=sky``) is a list of one.
    An unknown name is a ValueError naming ``key``."""
    if names is None:
        return None
    if isinstance(names, str):
        names = [names]
    unknown = [n for n in names if n not in classes]
    if unknown or not names:
        raise ValueError(f"{key}={list(names)}: expected class names among {list(classes)}")
    return [list(classes).index(n) for n in names]
