"""``trainer=spatial``: Lightning's DDP with every image split into bands across groups of processes.

A world of P·D processes is D data-parallel groups of P band processes (consecutive ranks, so a group
stays within a node when a node's GPU count is a multiple of P). The processes of a group load the same
batch (the samplers split the data over the D groups only), take the first process's copy of it, and each
computes its band (``segattn.parallel``). The loss is the mean over the valid pixels of the whole image,
formed from per-band sums; DDP's gradient average over all P·D processes then equals the data-parallel
average of whole-image gradients, because each band's loss is scaled by P.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from pytorch_lightning.strategies import DDPStrategy
from torch import Tensor

from ..parallel import BandGroup
from ..parallel.collectives import group_sum
from .losses import SegLoss, at_least_float32, cross_entropy_sums


class BandParallelStrategy(DDPStrategy):
    """DDP whose processes form groups of ``bands`` that share each image (``BandGroup``)."""

    strategy_name = "spatial"

    def __init__(self, bands: int = 2, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not isinstance(bands, int) or isinstance(bands, bool) or bands < 1:
            raise ValueError(
                f"trainer.strategy.bands={bands!r}; expected an integer >= 1 (processes per image)"
            )
        self.bands = bands
        self.band_group: BandGroup | None = None

    def setup_distributed(self) -> None:
        super().setup_distributed()
        world, bands = self.world_size, self.bands
        if world % bands:
            raise ValueError(
                f"trainer.strategy.bands={bands} does not divide the {world} processes "
                "(trainer.devices × trainer.num_nodes); each image needs a whole group"
            )
        groups = [dist.new_group(list(range(start, start + bands))) for start in range(0, world, bands)]
        start = self.global_rank // bands * bands
        self.band_group = BandGroup(
            groups[start // bands], tuple(range(start, start + bands)), self.global_rank - start
        )

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        """Split the data over the data-parallel groups only: a group's processes get the same batches."""
        return {"num_replicas": self.world_size // self.bands, "rank": self.global_rank // self.bands}


def share_batch(batch: dict[str, Any], group: BandGroup) -> dict[str, Any]:
    """``batch`` with the image and mask of the group's first process on every process of the group, so
    random augmentations, drawn per process, agree across the bands of an image."""
    shared = dict(batch)
    for key in ("image", "mask"):
        tensor = batch[key]
        shape = torch.tensor(tensor.shape, device=tensor.device)
        dist.broadcast(shape, src=group.peers[0], group=group.group)
        if tuple(shape.tolist()) != tuple(tensor.shape):
            tensor = tensor.new_empty(shape.tolist())
        tensor = tensor.contiguous()
        dist.broadcast(tensor, src=group.peers[0], group=group.group)
        shared[key] = tensor
    return shared


def band_group_of(trainer: Any) -> BandGroup | None:
    """The band group of this process when ``trainer`` runs ``BandParallelStrategy``; None otherwise."""
    return getattr(trainer.strategy, "band_group", None) if trainer is not None else None


def check_band_loss(dice: float, lovasz: float, ohem_thresh: float | None) -> None:
    """Refuse a loss that bands cannot add up: only cross entropy without OHEM is a sum over pixels."""
    if dice or lovasz or ohem_thresh is not None:
        raise ValueError(
            f"loss.dice={dice}, loss.lovasz={lovasz}, loss.ohem_thresh={ohem_thresh} "
            "need all pixels of the image at once; with trainer=spatial use cross entropy only "
            "(loss.dice=0 loss.lovasz=0 loss.ohem_thresh=null; class_weights and label_smoothing work)"
        )


def band_loss(
    criterion: SegLoss,
    logits: Tensor,
    aux_logits: Tensor | None,
    aux_weight: float,
    masks: Tensor,
    group: BandGroup,
) -> tuple[Tensor, Tensor]:
    """(the band's loss to backpropagate, the whole image's loss for logging).

    The whole image's loss is criterion(logits) + aux_weight · criterion(aux_logits), each a weighted mean
    over the valid pixels of all bands. The band's part is its pixels' sum over the group's weight sum,
    times the group size: DDP divides the gradients by all P·D processes.
    """
    check_band_loss(criterion.dice, criterion.lovasz, criterion.ohem_thresh)
    band_part, image = logits.new_zeros((), dtype=torch.float), logits.new_zeros((), dtype=torch.float)
    for head_logits, weight in ((logits, 1.0), (aux_logits, aux_weight)):
        if head_logits is None:
            continue
        total, weights = cross_entropy_sums(
            at_least_float32(head_logits),
            masks,
            criterion.ignore_index,
            criterion.class_weights,
            criterion.label_smoothing,
        )
        image_weights = group_sum(weights.detach(), group).clamp_min(1e-12)
        band_part = band_part + weight * criterion.ce * total / image_weights
        image = image + weight * criterion.ce * group_sum(total.detach(), group) / image_weights
    return band_part * group.size, image
