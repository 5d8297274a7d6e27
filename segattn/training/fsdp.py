"""Fully sharded data parallel training (``trainer=fsdp``, ``trainer=fsdp_cpu``): every process holds
1/world of each parameter, gradient and AdamW moment, and gathers one unit's parameters just before the
unit runs (forward, and again in backward), so a model larger than one device trains.

Built on torch's FSDP2 (``torch.distributed.fsdp.fully_shard``) through Lightning's
``ModelParallelStrategy``, which runs with any accelerator (NCCL on GPUs, gloo on CPU); Lightning's
``FSDPStrategy`` (FSDP1) accepts GPUs only. The units gathered one at a time (``shard_units``) are every
transformer ``Block`` (encoder and head) and each stage of a timm CNN encoder; the parameters outside them
(patch embeddings, stems, norms, heads) form the root unit. Buffers are not sharded: BatchNorm running
statistics stay per process (FSDP does not broadcast buffers as DDP does) unless
``trainer.sync_batchnorm=true`` (GPUs) synchronises the batch statistics themselves.

Checkpoints: ``save_distributed_checkpoint: false`` (the default here) gathers the full weights and
optimizer state on rank 0 and writes one ``last.ckpt`` like every other trainer, through the trainer's
checkpoint IO (``AtomicCheckpointIO``: temporary file, fsync, rename); eval, export and ``init_from`` read
it unchanged. ``true`` writes a folder with one shard per rank (torch.distributed.checkpoint; no atomic
rename) for models whose full state does not fit in rank 0's memory.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard, register_fsdp_forward_method

from ..models.blocks import Block
from ..models.unet import TimmCNNEncoder


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The modules sharded as units of their own: every ``Block`` and each stage of a timm CNN encoder that
    feeds a feature level (ResNet ``layer1``..``layer4``, ConvNeXt ``stages_0``..``stages_3``; the small
    stem stays in the root unit)."""
    units = [module for module in model.modules() if isinstance(module, Block)]
    for module in model.modules():
        if isinstance(module, TimmCNNEncoder):
            # timm flattens top-level Sequentials (stages.0 -> stages_0) in its feature-module names
            levels = {name.replace(".", "_") for name in module.model.feature_info.module_name()}
            units += [
                child
                for name, child in module.model.named_children()
                if name in levels and next(child.parameters(), None) is not None
            ]
    return units


def shard_model(model: nn.Module, mesh: DeviceMesh, reshard_after_forward: bool = True) -> None:
    """``fully_shard`` each unit of ``model`` (a Segmentor), then the model itself, in place.

    ``forward_with_aux`` (the training forward) gets FSDP's root hooks like ``forward``. With
    ``reshard_after_forward`` a unit frees its gathered parameters after its forward and gathers them again
    in backward (least memory); false keeps them until backward (one all-gather less per unit)."""
    for unit in shard_units(model):
        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    register_fsdp_forward_method(model, "forward_with_aux")


class FullyShardedStrategy(ModelParallelStrategy):
    """Lightning's ModelParallelStrategy as pure FSDP2 over all processes (no tensor parallelism), sharding
    the LightningModule's ``model`` per block (``shard_model``) before the optimizer is built.

    Gradient clipping by norm (``trainer.gradient_clip_val``) clips by the norm of the whole gradient:
    ``torch.nn.utils.clip_grad_norm_`` on the sharded (DTensor) gradients sums the squared shards of all
    ranks; clipping by value acts on each element and is unaffected by sharding.
    """

    def __init__(
        self, save_distributed_checkpoint: bool = False, reshard_after_forward: bool = True, **kwargs: Any
    ) -> None:
        super().__init__(save_distributed_checkpoint=save_distributed_checkpoint, **kwargs)
        self.reshard_after_forward = reshard_after_forward

    def setup_environment(self) -> None:
        """One data-parallel mesh dimension over every process of every node."""
        self._data_parallel_size = self.num_nodes * self.num_processes
        self._tensor_parallel_size = 1
        super().setup_environment()

    def setup(self, trainer: pl.Trainer) -> None:
        """Shard once (fit, then test, reuse the sharded model), then let Lightning move it and build the
        optimizer over the sharded parameters."""
        model = self.lightning_module.model
        if not isinstance(model, FSDPModule):
            shard_model(model, self.device_mesh["data_parallel"], self.reshard_after_forward)
        super().setup(trainer)
