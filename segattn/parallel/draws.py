"""The random draws of one image, the same on every band of it.

Dropout2d and drop path decide once per sample (and channel), not per pixel, so every band of an image must
draw the same decisions, or half an image would skip a block the other half runs. Each training step seeds the
generators with one number that the group's first process draws and broadcasts (``image_seed``), offset by
that rank so that data-parallel groups, holding different images, draw differently.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist

from .bands import BandGroup


def image_seed(group: BandGroup, device: torch.device) -> int:
    """A seed for this step's draws, the same on every process of ``group`` and different per group; every
    process advances the global CPU generator by one draw."""
    seed = torch.randint(2**62, (1,), dtype=torch.int64).to(device)
    dist.broadcast(seed, src=group.peers[0], group=group.group)
    return int(seed.item()) + group.peers[0]


@contextmanager
def drawing_from(seed: int, device: torch.device) -> Iterator[None]:
    """Run the block with the global generators (CPU, and ``device``'s on CUDA) seeded with ``seed``,
    restoring their states afterwards. Blocks under gradient checkpointing keep the state they saw, so their
    recomputation in backward draws the same again."""
    cuda = device.type == "cuda"
    devices = [torch.cuda.current_device() if device.index is None else device.index] if cuda else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield
