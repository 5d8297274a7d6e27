"""AveragePrecisionMetric (binned, bounded memory) against the exact per-pixel average precision."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from segattn.evaluation.average_precision import AveragePrecisionMetric, class_ids

IGN = 255


def exact_average_precision(scores: np.ndarray, positive: np.ndarray) -> float:
    """scikit-learn's average_precision_score, written out: Σ over distinct thresholds, from high to low,
    of (recall gained) × (precision at that threshold); tied scores form one threshold."""
    order = np.argsort(-scores, kind="stable")
    scores, positive = scores[order], positive[order]
    last_of_tie = np.r_[np.nonzero(np.diff(scores))[0], scores.size - 1]
    true_pos = np.cumsum(positive)[last_of_tie]
    predicted = last_of_tie + 1
    precision, recall = true_pos / predicted, true_pos / positive.sum()
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def probabilities_on_bin_centres(logits: torch.Tensor, bins: int) -> torch.Tensor:
    """Softmax probabilities moved to the centre of their bin: the binned AP is then exact."""
    probs = logits.softmax(dim=1)
    return ((probs * bins).floor().clamp(max=bins - 1) + 0.5) / bins


@pytest.mark.parametrize("bins", [10, 1000])
def test_ap_equals_exact_computation_when_scores_sit_on_bins(bins):
    generator = torch.Generator().manual_seed(0)
    target = torch.randint(0, 3, (2, 9, 11), generator=generator)
    target[0, 0, :4] = IGN
    logits = torch.randn(2, 3, 9, 11, generator=generator) + 2.0 * torch.nn.functional.one_hot(
        target.clamp(max=2), 3
    ).permute(0, 3, 1, 2)
    probs = probabilities_on_bin_centres(logits, bins)
    metric = AveragePrecisionMetric(3, IGN, bins=bins)
    metric.update(probs[:1], target[:1])  # two updates: counts add up
    metric.update(probs[1:], target[1:])
    scores = metric.compute()
    valid = (target != IGN).flatten()
    for c in range(3):
        expected = exact_average_precision(
            probs[:, c].flatten()[valid].double().numpy(), (target.flatten()[valid] == c).numpy()
        )
        assert scores["AP"][c].item() == pytest.approx(100 * expected, abs=1e-9)
    assert scores["mAP"].item() == pytest.approx(scores["AP"].mean().item())


def test_ap_of_random_scores_is_close_to_exact_with_many_bins():
    generator = torch.Generator().manual_seed(1)
    target = (torch.rand(1, 64, 64, generator=generator) < 0.02).long()  # a rare class, 2 % of pixels
    probs = torch.rand(1, 64, 64, generator=generator) * 0.6 + 0.4 * target
    probs = torch.stack([1 - probs, probs], dim=1)
    metric = AveragePrecisionMetric(2, IGN, bins=1000)
    metric.update(probs, target)
    expected = exact_average_precision(probs[:, 1].flatten().double().numpy(), target.flatten().numpy() == 1)
    assert metric.compute()["AP"][1].item() == pytest.approx(100 * expected, abs=0.5)


def test_perfect_scores_give_100_and_an_absent_class_nan_left_out_of_the_mean():
    target = torch.tensor([[[0, 0, 1], [1, 0, 0]]])
    probs = torch.nn.functional.one_hot(target, 3).permute(0, 3, 1, 2).float()
    metric = AveragePrecisionMetric(3, IGN, mean_classes=[1, 2])
    metric.update(probs, target)
    scores = metric.compute()
    assert scores["AP"][:2].tolist() == pytest.approx([100.0, 100.0])
    assert math.isnan(scores["AP"][2].item())
    assert scores["mAP"].item() == pytest.approx(100.0)  # class 2 has no pixels: not averaged


def test_memory_is_bounded_by_bins_not_pixels():
    metric = AveragePrecisionMetric(4, IGN, bins=50)
    for _ in range(3):
        metric.update(torch.rand(2, 4, 40, 40).softmax(1), torch.randint(0, 4, (2, 40, 40)))
    assert metric.positives.shape == metric.negatives.shape == (4, 50)
    assert int(metric.positives.sum() + metric.negatives.sum()) == 3 * 2 * 40 * 40 * 4


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="bins=1"):
        AveragePrecisionMetric(3, bins=1)
    with pytest.raises(ValueError, match="mean_classes"):
        AveragePrecisionMetric(3, mean_classes=[3])
    with pytest.raises(ValueError, match=r"\[B, 3, H, W\]"):
        AveragePrecisionMetric(3).update(torch.rand(1, 2, 4, 4), torch.zeros(1, 4, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"metrics.ap_mean_classes=\['tumour'\]"):
        class_ids(["tumour"], ["background", "lesion"], "metrics.ap_mean_classes")
    assert class_ids(["lesion"], ["background", "lesion"], "metrics.ap_mean_classes") == [1]
    assert class_ids(None, ["background", "lesion"], "metrics.ap_mean_classes") is None
    # metrics.ap_mean_classes=lesion on the command line is one name, not the letters l, e, s, i, o, n
    assert class_ids("lesion", ["background", "lesion"], "metrics.ap_mean_classes") == [1]
