"""A training DataLoader that can resume in the middle of an epoch, batch for batch.

A run stopped mid-epoch (a preempted job) must go on with the batches the uninterrupted run would have
seen next, with the same augmentations. Everything random about an epoch's batches (the shuffle order and
the workers' seeds) is drawn from the global torch RNG when the epoch's iterator is created, so the loader
records that RNG state and how many batches it has handed out; on resume it recreates the epoch from that
state and replays (loads and discards) the batches already trained on. Replaying instead of skipping
indices keeps every augmentation stream exact, at the cost of loading those batches once more.

The position lives in an ``EpochPosition`` that the DataModule owns and saves with its own
``state_dict`` (Lightning restores DataModules before it first builds the train loader, whereas its
loader-level restore comes after the optimizers were configured, too late for the first epoch's iterator),
and that survives Lightning re-creating the loader (a DistributedSampler under DDP).
Exact with ``num_workers >= 1`` and ``persistent_workers: false`` (workers seeded per epoch); in-process
loading (``num_workers: 0``) seeds its augmentation stream once per run, so it resumes the right batches
with other augmentations.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader


class EpochPosition:
    """Where the current epoch stands: the torch RNG state its iterator was created with and how many
    batches it has handed out; and, after ``load_state_dict``, where the next epoch must pick up."""

    def __init__(self) -> None:
        self.epoch_rng: torch.Tensor | None = None
        self.handed_out = 0
        self.pending: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        """``{"epoch_rng": ByteTensor, "batches": int}`` (empty before the first epoch): plain tensors and
        numbers, so checkpoints load with ``weights_only=True``."""
        if self.epoch_rng is None:
            return {}
        return {"epoch_rng": self.epoch_rng, "batches": self.handed_out}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next epoch continue the saved one after its first ``batches`` batches."""
        self.pending = dict(state) or None


class ResumableDataLoader(DataLoader):
    """``DataLoader`` that records its ``EpochPosition`` and, when the position holds a saved one,
    recreates that epoch and replays its first batches. ``state_dict`` / ``load_state_dict`` tell
    Lightning the loader is resumable (it stores the same position in its loop state)."""

    def __init__(self, *args: Any, position: EpochPosition | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.position = position if position is not None else EpochPosition()

    def state_dict(self) -> dict[str, Any]:
        return self.position.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position.load_state_dict(state)

    def __iter__(self) -> Iterator[Any]:
        position = self.position
        resume, position.pending = position.pending, None
        current_rng = torch.get_rng_state()
        if resume:
            torch.set_rng_state(resume["epoch_rng"])
        position.epoch_rng, position.handed_out = torch.get_rng_state(), 0
        iterator = super().__iter__()  # draws the workers' base seed (and, lazily, the shuffle seed)
        if resume and resume["batches"]:
            for _ in range(resume["batches"]):
                next(iterator)
                position.handed_out += 1
            torch.set_rng_state(current_rng)  # the restored training RNG, as the checkpoint left it
        return self._count(iterator)

    def _count(self, iterator: Iterator[Any]) -> Iterator[Any]:
        for batch in iterator:
            self.position.handed_out += 1
            yield batch
