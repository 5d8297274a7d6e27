"""The random draws of one image, the same on every band of it.

Dropout2d and stochastic depth (drop path) draw one decision per sample (and channel), not per pixel: one
process running the whole image makes each decision once for all its rows. The processes of a band group
must make the same decisions, or half of an image would skip a block that the other half runs. Each
training step therefore runs the band forward with the random generators seeded by one number that the
group's first process draws and broadcasts (``image_seed``); the data-parallel groups, which hold different
images, offset it by their first rank, so their images draw different decisions. The generators' own
streams continue afterwards as if the block had drawn nothing beyond the seed (``drawing_from``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist

from .bands import BandGroup


def image_seed(group: BandGroup, device: torch.device) -> int:
    """A seed for this step's draws, the same on every process of ``group`` (drawn by its first process
    from the global CPU generator, which every process advances by one draw), different per group."""
    seed = torch.randint(2**62, (1,), dtype=torch.int64).to(device)
    dist.broadcast(seed, src=group.peers[0], group=group.group)
    return int(seed.item()) + group.peers[0]


@contextmanager
def drawing_from(seed: int, device: torch.device) -> Iterator[None]:
    """Run the block with the global generators (CPU, and ``device``'s on CUDA) seeded with ``seed``; their
    states are restored afterwards. Blocks under gradient checkpointing keep the state they saw, so their
    recomputation in the backward pass draws the same again."""
    cuda = device.type == "cuda"
    devices = [torch.cuda.current_device() if device.index is None else device.index] if cuda else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield
