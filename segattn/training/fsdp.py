"""Fully sharded data parallel training (``trainer=fsdp``, ``trainer=fsdp_cpu``): a model larger than one
device trains.

Every process holds 1/world of each parameter, gradient and AdamW moment; a unit's (``shard_units``)
parameters are gathered just before it runs, forward and again backward, and freed after. Built on torch's
FSDP2 (``fully_shard``) through Lightning's ``ModelParallelStrategy``, which runs on any accelerator (NCCL on
GPUs, gloo on CPU); Lightning's ``FSDPStrategy`` (FSDP1) takes GPUs only. Buffers are not sharded: each
process keeps its own BatchNorm running statistics (FSDP does not broadcast buffers as DDP does); checkpoints
hold rank 0's.

Checkpoints: the full weights and optimizer state are gathered on rank 0 (on the CPU) and written as one
``last.ckpt`` through ``checkpointing.AtomicCheckpointIO``, so resume, eval, export and ``init_from`` read it
unchanged. Lightning's sharded checkpoint folders (``save_distributed_checkpoint``) are refused: none of those
readers takes a folder, and their writer has no atomic rename.
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
    """The modules sharded as units of their own: every ``Block`` (encoder and head) and each stage of a timm
    CNN encoder that feeds a feature level (ResNet ``layer1``..``layer4``, ConvNeXt
    ``stages_0``..``stages_3``). The rest (patch embeddings, stems, norms, heads) is the root unit."""
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


def shard_model(model: nn.Module, mesh: DeviceMesh) -> None:
    """``fully_shard`` each unit of ``model`` (a Segmentor), then the model itself, in place;
    ``forward_with_aux`` (the training forward) gets FSDP's root hooks like ``forward``."""
    for unit in shard_units(model):
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh)
    register_fsdp_forward_method(model, "forward_with_aux")


class FullyShardedStrategy(ModelParallelStrategy):
    """Lightning's ModelParallelStrategy as pure FSDP2 over all processes (no tensor parallelism), sharding
    the LightningModule's ``model`` per block (``shard_model``) before the optimizer is built.

    Gradient clipping by norm (``trainer.gradient_clip_val``) clips by the norm of the whole gradient:
    ``torch.nn.utils.clip_grad_norm_`` on the sharded (DTensor) gradients sums the squared shards of all
    ranks; clipping by value acts on each element and is unaffected by sharding.
    """

    strategy_name = "fsdp"  # trainer.strategy.name, which the config checks read

    def __init__(self, **kwargs: Any) -> None:
        if kwargs.pop("save_distributed_checkpoint", False):
            raise ValueError(
                "trainer.strategy.save_distributed_checkpoint=true: sharded checkpoint folders are not "
                "supported (resume, eval and export read one checkpoint file); expected false"
            )
        super().__init__(save_distributed_checkpoint=False, **kwargs)

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
            shard_model(model, self.device_mesh["data_parallel"])
        super().setup(trainer)

    def on_train_start(self) -> None:
        """Create a resumed run's first batch iterator again, as DDP would have created it.

        This strategy restores checkpoints after ``setup`` (into the sharded model), but ``setup`` builds the
        LR schedule, whose step count makes Lightning create the first iterator before the checkpoint's RNG
        state and the DataModule's epoch position (``segattn.data.resumable``) are restored. The new iterator
        draws its shuffle and worker seeds from the restored RNG and replays the batches a mid-epoch
        checkpoint had already trained on."""
        super().on_train_start()
        trainer = self.lightning_module.trainer
        fetcher = trainer.fit_loop._data_fetcher  # None without training batches (limit_train_batches=0)
        if trainer.ckpt_path is not None and fetcher is not None:
            iter(fetcher)  # Lightning's own call at the end of FitLoop.setup_data, repeated
