"""Losses against their definitions written out by hand on tiny planted examples."""

import math

import pytest
import torch
import torch.nn.functional as F

from segattn.training.losses import PixelCrossEntropy, SegLoss, cross_entropy, dice_loss, lovasz_softmax

IGN = 255


def one_hot_logits(pred: list[list[int]], num_classes: int, scale: float = 50.0) -> torch.Tensor:
    """Logits whose softmax is (numerically) the one-hot of ``pred``: hard predictions."""
    onehot = torch.nn.functional.one_hot(torch.tensor([pred]), num_classes).permute(0, 3, 1, 2)
    return scale * onehot.float()


def test_cross_entropy_ignores_pixels_and_weights_classes():
    torch.manual_seed(0)
    logits = torch.randn(1, 3, 2, 2)
    target = torch.tensor([[[0, 2], [IGN, 1]]])
    weight = torch.tensor([1.0, 2.0, 3.0])
    nll = {}
    for (i, j), c in [((0, 0), 0), ((0, 1), 2), ((1, 1), 1)]:
        z = logits[0, :, i, j]
        nll[(i, j)] = (math.log(z.exp().sum().item()) - z[c].item(), weight[c].item())
    plain = sum(v for v, _ in nll.values()) / 3
    weighted = sum(v * w for v, w in nll.values()) / sum(w for _, w in nll.values())
    assert cross_entropy(logits, target, IGN).item() == pytest.approx(plain, rel=1e-5)
    assert cross_entropy(logits, target, IGN, weight=weight).item() == pytest.approx(weighted, rel=1e-5)


def test_ohem_keeps_min_kept_hardest_pixels():
    # true-class probabilities differ per pixel; with thresh 0 only the 2 least confident pixels count.
    logits = torch.zeros(1, 2, 1, 4)
    logits[0, 0, 0] = torch.tensor([3.0, 1.0, -1.0, -2.0])  # class 0 logit; class 1 logit is 0
    target = torch.zeros(1, 1, 4, dtype=torch.long)
    per_pixel = [math.log(1 + math.exp(-v)) for v in (3.0, 1.0, -1.0, -2.0)]  # -log sigmoid(v)
    hardest_two = (per_pixel[2] + per_pixel[3]) / 2
    got = cross_entropy(logits, target, IGN, ohem_thresh=0.0, ohem_min_kept=2)
    assert got.item() == pytest.approx(hardest_two, rel=1e-5)
    # thresh 1.0: every pixel is "hard", OHEM equals plain CE
    assert cross_entropy(logits, target, IGN, ohem_thresh=1.0, ohem_min_kept=1).item() == pytest.approx(
        sum(per_pixel) / 4, rel=1e-5
    )


# Hard predictions on a 2x3 image with an ignore pixel; classes 0..2 (class 2 absent from labels).
PRED = [[0, 0, 1], [1, 2, 0]]
TARGET = torch.tensor([[[0, 1, 1], [1, 1, IGN]]])
# valid pixels: (0,0) t0 p0, (0,1) t1 p0, (0,2) t1 p1, (1,0) t1 p1, (1,1) t1 p2
# class 0: I=1, |P|=2, |T|=1, U=2 ; class 1: I=2, |P|=2, |T|=4, U=4 ; class 2: I=0, |P|=1, |T|=0


def test_lovasz_softmax_equals_jaccard_loss_on_hard_predictions():
    # On one-hot probabilities the Lovász extension equals 1 - IoU per present class (here 0 and 1).
    expected = ((1 - 1 / 2) + (1 - 2 / 4)) / 2
    assert lovasz_softmax(one_hot_logits(PRED, 3), TARGET, IGN).item() == pytest.approx(expected, abs=1e-4)


def test_dice_on_hard_predictions_averages_present_classes_only():
    dice = [(2 * 1 + 1) / (2 + 1 + 1), (2 * 2 + 1) / (2 + 4 + 1), (0 + 1) / (1 + 0 + 1)]
    # class 2 is predicted once but never labelled: by default it adds no term
    got = dice_loss(one_hot_logits(PRED, 3), TARGET, IGN)
    assert got.item() == pytest.approx(1 - (dice[0] + dice[1]) / 2, abs=1e-4)
    every_class = dice_loss(one_hot_logits(PRED, 3), TARGET, IGN, present_only=False)
    assert every_class.item() == pytest.approx(1 - sum(dice) / 3, abs=1e-4)


@pytest.mark.parametrize("present_only", [True, False])
def test_dice_equals_its_formula_in_float64(present_only):
    # Soft probabilities on a batch where class 3 of 5 is absent and some pixels are ignored: the loss is
    # 1 - the mean over the classes labelled in the batch of (2 sum(p t) + 1) / (sum p + sum t + 1).
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 5, 6, 7, generator=generator, dtype=torch.float64)
    target = torch.randint(0, 5, (2, 6, 7), generator=generator)
    target[target == 3] = 4
    target[torch.rand(2, 6, 7, generator=generator) < 0.2] = IGN
    valid = target != IGN
    prob = logits.softmax(1)
    terms = []
    for c in range(5):
        p, t = prob[:, c][valid], (target[valid] == c).double()
        if present_only and t.sum() == 0:
            continue
        terms.append((2 * (p * t).sum() + 1) / (p.sum() + t.sum() + 1))
    expected = 1 - torch.stack(terms).mean()
    got = dice_loss(logits, target, IGN, present_only=present_only)
    assert len(terms) == (4 if present_only else 5)
    assert got.item() == pytest.approx(expected.item(), rel=1e-9)


def test_dice_of_a_batch_without_the_class_does_not_push_it_down():
    # One class, absent from the labels: the present-only loss gives its logits no gradient through the
    # absent term (only through the softmax shared with the present classes), the every-class loss does.
    logits = torch.zeros(1, 3, 4, 4, dtype=torch.float64, requires_grad=True)
    target = torch.zeros(1, 4, 4, dtype=torch.long)
    target[0, :2] = 1
    present = dice_loss(logits, target)
    (grad_present,) = torch.autograd.grad(present, logits)
    every = dice_loss(logits, target, present_only=False)
    (grad_every,) = torch.autograd.grad(every, logits)
    # with uniform probabilities class 2's gradient comes only from the softmax coupling in the present
    # form; the every-class form adds a push of its own, so class 2's logits move further down
    assert (grad_every[0, 2] > grad_present[0, 2]).all()


def test_segloss_is_weighted_sum_and_zero_without_valid_pixels():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 4, 5, requires_grad=True)
    target = torch.randint(0, 3, (2, 4, 5))
    loss = SegLoss(num_classes=3, ce=1.0, dice=0.5, lovasz=0.25)
    expected = cross_entropy(logits, target) + 0.5 * dice_loss(logits, target)
    expected = expected + 0.25 * lovasz_softmax(logits, target)
    assert loss(logits, target).item() == pytest.approx(expected.item(), rel=1e-6)

    all_ignored = torch.full_like(target, IGN)
    value = SegLoss(num_classes=3, dice=1.0, lovasz=1.0, ohem_thresh=0.7)(logits, all_ignored)
    value.backward()
    assert value.item() == 0.0
    assert torch.isfinite(logits.grad).all()


def test_segloss_rejects_bad_configuration():
    with pytest.raises(ValueError, match="class_weights has 2 entries"):
        SegLoss(num_classes=3, class_weights=[1.0, 2.0])
    with pytest.raises(ValueError, match="not all 0"):
        SegLoss(num_classes=3, ce=0.0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("ignore_index", [255, -100])
def test_pixel_cross_entropy_equals_torchs_per_pixel_loss_and_gradient(
    dtype: torch.dtype, weighted: bool, smoothing: float, ignore_index: int
) -> None:
    """Against F.cross_entropy(reduction="none"): losses and the logits' gradient for an arbitrary upstream
    gradient, with class weights, label smoothing and ignored pixels."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 6, 7, generator=generator, dtype=dtype).requires_grad_()
    target = torch.randint(0, 5, (2, 6, 7), generator=generator)
    target[0, :2] = ignore_index
    weight = torch.rand(5, generator=generator, dtype=dtype) + 0.5 if weighted else None
    upstream = torch.randn(2, 6, 7, generator=generator, dtype=dtype)
    expected = F.cross_entropy(
        logits, target, weight, ignore_index=ignore_index, reduction="none", label_smoothing=smoothing
    )
    losses = PixelCrossEntropy.apply(logits, target, weight, ignore_index, smoothing)
    tolerance = {"rtol": 0, "atol": 1e-12 if dtype == torch.float64 else 1e-6}
    torch.testing.assert_close(losses, expected, **tolerance)
    (want,) = torch.autograd.grad(expected, logits, upstream)
    (got,) = torch.autograd.grad(losses, logits, upstream)
    torch.testing.assert_close(got, want, **tolerance)


def test_pixel_cross_entropy_writes_its_gradient_over_the_saved_log_probabilities() -> None:
    """Backward holds one map of the logits' size: the gradient is the saved log-probabilities' memory, and
    a second backward through it refuses to read them."""
    logits = torch.randn(2, 5, 6, 7, requires_grad=True)
    losses = PixelCrossEntropy.apply(logits, torch.randint(0, 5, (2, 6, 7)), None, 255, 0.0)
    saved = losses.grad_fn.saved_tensors[0].data_ptr()
    (grad,) = torch.autograd.grad(losses.sum(), logits, retain_graph=True)
    assert grad.data_ptr() == saved
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(losses.sum(), logits)
