"""Segmentation losses on logits [B, K, H, W] and labels [B, H, W] (ignore_index pixels never count).

Cross entropy (class weights, label smoothing, optional OHEM), soft Dice and Lovász-softmax, combined
by ``SegLoss`` as a weighted sum. Every loss is 0 (not NaN) on a batch without a valid pixel, so a
random crop that lands entirely on ignore pixels cannot poison training.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from ..errors import ConfigError
from ..files import conf_values

CE = conf_values("loss/ce")  # SegLoss's defaults: conf/loss/ce.yaml, the loss a run takes unless told


def at_least_float32(tensor: Tensor) -> Tensor:
    """``tensor`` in float32 when it is half or bfloat16 (or float32); float64 stays float64, so the loss
    can be checked against its formula in double precision."""
    return tensor.to(torch.promote_types(tensor.dtype, torch.float32))


def cross_entropy(
    logits: Tensor,
    target: Tensor,
    ignore_index: int = 255,
    weight: Tensor | None = None,
    label_smoothing: float = 0.0,
    ohem_thresh: float | None = None,
    ohem_min_kept: int = 100_000,
) -> Tensor:
    """Weighted mean pixel cross entropy; with ``ohem_thresh`` only hard pixels count (OHEM).

    OHEM keeps the pixels whose probability of the true class is at most max(ohem_thresh, p_k), where
    p_k is the ``ohem_min_kept``-th smallest such probability, so at least min_kept pixels remain.
    """
    total, weight_sum = cross_entropy_sums(
        logits, target, ignore_index, weight, label_smoothing, ohem_thresh, ohem_min_kept
    )
    return total / weight_sum.clamp_min(1e-12)


def cross_entropy_sums(
    logits: Tensor,
    target: Tensor,
    ignore_index: int = 255,
    weight: Tensor | None = None,
    label_smoothing: float = 0.0,
    ohem_thresh: float | None = None,
    ohem_min_kept: int = 100_000,
) -> tuple[Tensor, Tensor]:
    """The weighted sum of the counted pixels' losses and the sum of their weights (``cross_entropy`` is
    their ratio): sums that add up over the bands of a split image."""
    weight = None if weight is None else weight.to(logits.dtype)
    losses = PixelCrossEntropy.apply(logits, target, weight, ignore_index, label_smoothing)
    keep = target != ignore_index
    if ohem_thresh is not None and keep.any():
        with torch.no_grad():
            safe_target = target.masked_fill(~keep, 0).unsqueeze(1)
            prob = logits.softmax(dim=1).gather(1, safe_target).squeeze(1)
            valid_prob = prob[keep]
            k = min(ohem_min_kept, valid_prob.numel())
            kth = valid_prob.kthvalue(k).values if k > 0 else valid_prob.new_tensor(0.0)
            keep &= prob <= torch.clamp(kth, min=ohem_thresh)
    pixel_weight = keep.float() if weight is None else weight[target.masked_fill(~keep, 0)] * keep
    return (losses * keep).sum(), pixel_weight.sum()


class PixelCrossEntropy(torch.autograd.Function):
    """``F.cross_entropy(logits, target, weight, ignore_index=..., reduction="none", label_smoothing=ε)``:
    per pixel −Σ_c w_c·q_c·log p_c with q = (1 − ε)·onehot(target) + ε/K, 0 at ignored pixels. Backward
    holds one map of the logits' size where autograd's log-softmax and NLL hold three (the saved
    log-probabilities, NLL's gradient and log-softmax's): ∂z_j = ∂loss·(p_j·Σ_c w_c·q_c − w_j·q_j), written
    over the saved log-probabilities, so a second backward through it fails loudly rather than reading them.
    """

    @staticmethod
    def forward(
        ctx: Any, logits: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int, smoothing: float
    ) -> Tensor:
        log_probs = F.log_softmax(logits, dim=1)
        losses = F.nll_loss(log_probs, target, weight, ignore_index=ignore_index, reduction="none")
        if smoothing:
            spread = -(log_probs * per_class(weight, log_probs)).sum(dim=1) / logits.shape[1]
            losses = (1 - smoothing) * losses + smoothing * spread.masked_fill(target == ignore_index, 0)
        ctx.save_for_backward(log_probs, target, weight)
        ctx.ignore_index, ctx.smoothing = ignore_index, smoothing
        return losses

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        log_probs, target, weight = ctx.saved_tensors
        smoothing, classes = ctx.smoothing, log_probs.shape[1]
        ignored = target == ctx.ignore_index
        safe_target = target.masked_fill(ignored, 0).unsqueeze(1)  # any class: its gradient is 0 there
        grad = grad.masked_fill(ignored, 0)
        if weight is not None:
            grad_target = grad * weight[safe_target.squeeze(1)]  # ∂loss·w_y
            total = (1 - smoothing) * grad_target + smoothing * weight.mean() * grad  # ∂loss·Σ_c w_c·q_c
        else:
            grad_target, total = grad, grad
        grad_logits = log_probs.exp_().mul_(total.unsqueeze(1))
        grad_logits.scatter_add_(1, safe_target, grad_target.unsqueeze(1).mul(smoothing - 1))
        if smoothing:
            grad_logits.sub_(smoothing / classes * grad.unsqueeze(1) * per_class(weight, log_probs))
        return grad_logits, None, None, None, None


def per_class(weight: Tensor | None, like: Tensor) -> Tensor | float:
    """The class weights shaped to broadcast over ``like``'s class dimension (1 without them)."""
    return 1.0 if weight is None else weight.view(1, -1, *[1] * (like.ndim - 2))


def dice_loss(
    logits: Tensor, target: Tensor, ignore_index: int = 255, smooth: float = 1.0, present_only: bool = True
) -> Tensor:
    """1 - mean over classes of the soft Dice coefficient (2|P∩T| + s) / (|P| + |T| + s) on valid pixels.

    With ``present_only`` (the default) the mean runs over the classes labelled somewhere in the batch's
    valid pixels. For a class absent from the batch the coefficient is s / (|P| + s): its only way up is to
    predict that class nowhere, so averaging it in pushes rare classes (lesions missing from most crops)
    toward zero everywhere, crop after crop. ``present_only=False`` keeps every class (the V-Net form many
    libraries use); a batch without a valid pixel gives 0 either way.
    """
    return dice_from_sums(*dice_sums(logits, target, ignore_index), smooth, present_only)


def dice_sums(logits: Tensor, target: Tensor, ignore_index: int = 255) -> tuple[Tensor, Tensor, Tensor]:
    """Per class over the valid pixels: Σ p·t (intersection), Σ p (predicted) and Σ t (labelled), p the
    softmax in at least float32 and t the one-hot labels; sums that add up over the rows of an image."""
    num_classes = logits.shape[1]
    valid = (target != ignore_index).unsqueeze(1)  # [B, 1, H, W]
    prob = at_least_float32(logits).softmax(dim=1) * valid
    one_hot = F.one_hot(target.masked_fill(~valid.squeeze(1), 0), num_classes).permute(0, 3, 1, 2) * valid
    dims = (0, 2, 3)
    return (prob * one_hot).sum(dims), prob.sum(dims), one_hot.sum(dims)


def dice_from_sums(
    intersection: Tensor, predicted: Tensor, labelled: Tensor, smooth: float = 1.0, present_only: bool = True
) -> Tensor:
    """``dice_loss`` from ``dice_sums``' per-class sums (of the whole batch, or added up over its rows)."""
    dice = (2 * intersection + smooth) / (predicted + labelled + smooth)
    if not present_only:
        return 1 - dice.mean()  # exactly 0 without a valid pixel: every coefficient is s / s
    present = labelled > 0
    return 1 - dice[present].mean() if present.any() else predicted.sum() * 0


def loss_from_sums(
    criterion: SegLoss,
    ce_sum: Tensor,
    ce_weight: Tensor,
    intersection: Tensor,
    predicted: Tensor,
    labelled: Tensor,
) -> Tensor:
    """``criterion``'s cross entropy and Dice (``criterion.sums_over_pixels``) from their pixel sums over
    the batch (``cross_entropy_sums``, ``dice_sums``), in at least float32."""
    total = ce_sum.new_zeros((), dtype=torch.promote_types(ce_sum.dtype, torch.float32))
    if criterion.ce:
        total = total + criterion.ce * ce_sum / ce_weight.clamp_min(1e-12)
    if criterion.dice:
        dice = dice_from_sums(intersection, predicted, labelled, present_only=criterion.dice_present_only)
        total = total + criterion.dice * dice
    return total


def lovasz_grad(gt_sorted: Tensor) -> Tensor:
    """Gradient of the Lovász extension of the Jaccard loss at errors sorted in decreasing order."""
    gts = gt_sorted.sum()
    intersection = gts - gt_sorted.cumsum(0)
    union = gts + (1 - gt_sorted).cumsum(0)
    jaccard = 1 - intersection / union
    return torch.cat([jaccard[:1], jaccard[1:] - jaccard[:-1]])


def lovasz_softmax(logits: Tensor, target: Tensor, ignore_index: int = 255) -> Tensor:
    """Lovász-softmax (Berman et al. 2018, arXiv 1705.08790): a convex surrogate of 1 - IoU, averaged
    over the classes present in the valid labels of the batch."""
    num_classes = logits.shape[1]
    prob = logits.float().softmax(dim=1).permute(0, 2, 3, 1).reshape(-1, num_classes)  # [P, K]
    labels = target.reshape(-1)
    valid = labels != ignore_index
    prob, labels = prob[valid], labels[valid]
    present = labels.unique().tolist()
    losses = [torch.dot(*_sorted_errors_and_grad(prob[:, c], (labels == c).float())) for c in present]
    return torch.stack(losses).mean() if losses else logits.sum() * 0


def _sorted_errors_and_grad(prob: Tensor, foreground: Tensor) -> tuple[Tensor, Tensor]:
    errors = (foreground - prob).abs()
    errors_sorted, order = errors.sort(descending=True)
    return errors_sorted, lovasz_grad(foreground[order])


def check_chunk_rows(chunk_rows: int | None, lovasz: float, ohem_thresh: float | None) -> None:
    """Refuse a ``loss.chunk_rows`` that is not a positive integer, or one combined with a term that needs
    every pixel of the batch at once (Lovász's sorted errors, OHEM's k-th probability)."""
    if chunk_rows is None:
        return
    if not isinstance(chunk_rows, int) or isinstance(chunk_rows, bool) or chunk_rows < 1:
        raise ConfigError(
            f"loss.chunk_rows={chunk_rows!r}; expected null or an integer >= 1 (rows per chunk)"
        )
    if lovasz or ohem_thresh is not None:
        raise ConfigError(
            f"loss.chunk_rows={chunk_rows} with loss.lovasz={lovasz}, loss.ohem_thresh={ohem_thresh}: "
            "Lovász and OHEM rank all pixels at once; set loss.chunk_rows=null, or loss.lovasz=0 and "
            "loss.ohem_thresh=null"
        )


class SegLoss(nn.Module):
    """``ce * CE + dice * Dice + lovasz * Lovász``; terms with weight 0 are not computed.

    ``chunk_rows`` (None: off) asks the trainer to compute the loss from the head's low-resolution logits,
    upsampled and scored that many full-resolution rows at a time and recomputed in backward
    (``chunked.chunked_seg_loss``): the same value without full-resolution logits of every class in memory.
    Lovász and OHEM rank all pixels of the batch at once, so they refuse it.
    """

    def __init__(
        self,
        num_classes: int,
        ce: float = CE["ce"],
        dice: float = CE["dice"],
        lovasz: float = CE["lovasz"],
        dice_present_only: bool = CE["dice_present_only"],
        class_weights: Sequence[float] | None = CE["class_weights"],
        label_smoothing: float = CE["label_smoothing"],
        ohem_thresh: float | None = CE["ohem_thresh"],
        ohem_min_kept: int = CE["ohem_min_kept"],
        ignore_index: int = 255,
        chunk_rows: int | None = CE["chunk_rows"],
    ) -> None:
        super().__init__()
        check_chunk_rows(chunk_rows, lovasz, ohem_thresh)
        self.chunk_rows = chunk_rows
        if min(ce, dice, lovasz) < 0 or ce + dice + lovasz == 0:
            raise ValueError(f"loss weights ce={ce}, dice={dice}, lovasz={lovasz} must be >= 0 and not all 0")
        self.ce, self.dice, self.lovasz = ce, dice, lovasz
        self.dice_present_only = dice_present_only
        self.label_smoothing = label_smoothing
        self.ohem_thresh = ohem_thresh
        self.ohem_min_kept = ohem_min_kept
        self.ignore_index = ignore_index
        if class_weights is not None and len(class_weights) != num_classes:
            raise ValueError(
                f"loss.class_weights has {len(class_weights)} entries; expected one per class ({num_classes})"
            )
        weight = None if class_weights is None else torch.tensor(list(class_weights), dtype=torch.float)
        self.register_buffer("class_weights", weight, persistent=False)

    @property
    def sums_over_pixels(self) -> bool:
        """Whether every term is a sum over pixels (cross entropy, Dice), so that it adds up over parts of
        the image: not Lovász or OHEM, which rank all pixels at once."""
        return not self.lovasz and self.ohem_thresh is None

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        total = logits.new_zeros((), dtype=torch.float)
        if self.ce:
            total = total + self.ce * cross_entropy(
                at_least_float32(logits),
                target,
                self.ignore_index,
                self.class_weights,
                self.label_smoothing,
                self.ohem_thresh,
                self.ohem_min_kept,
            )
        if self.dice:
            total = total + self.dice * dice_loss(
                logits, target, self.ignore_index, present_only=self.dice_present_only
            )
        if self.lovasz:
            total = total + self.lovasz * lovasz_softmax(logits, target, self.ignore_index)
        return total
