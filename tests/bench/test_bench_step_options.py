"""`bench model`'s training-step options of a variant (issue 31 item 3): `grad_checkpointing: true`
checkpoints the model the row trains, `loss_chunk_rows: N` scores its stride-4 logits in row chunks; the
chunked step's loss is the cross entropy of the plain step. The step is the training module's own
(`SegmentationModule.head_losses`, built by `training.run.build_module`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from segattn.bench.model import TrainStep, build_kwargs
from segattn.bench.specs import spec_of
from segattn.training.module import SegmentationModule

TINY_PVT = {"name": "pvt", "embed_dims": [8, 8, 16, 16], "depths": [1, 1, 1, 1], "num_heads": [1, 1, 1, 1]}
TINY_PVT |= {"head_channels": 8, "dropout": 0.0}


def step(variant: str | dict) -> TrainStep:
    torch.manual_seed(0)
    kwargs = build_kwargs(spec_of(TINY_PVT), spec_of(variant))
    return TrainStep(kwargs, (40, 72), 1, "fp32", torch.device("cpu"))


def test_spec_options_switch_checkpointing_and_the_chunked_loss() -> None:
    plain, checkpointed = (
        step("linear"),
        step({"name": "linear", "grad_checkpointing": True, "loss_chunk_rows": 16}),
    )
    assert not plain.model.recompute_heads and checkpointed.model.recompute_heads
    assert (plain.module.criterion.chunk_rows, checkpointed.module.criterion.chunk_rows) == (None, 16)
    assert isinstance(plain.module, SegmentationModule)
    checkpointed.model.load_state_dict(plain.model.state_dict())
    plain.model.eval(), checkpointed.model.eval()  # no dropout: the two losses see the same logits
    logits, _ = plain.model.forward_with_aux(plain.images)
    chunked, _ = checkpointed.module.head_losses(plain.images, plain.masks)
    torch.testing.assert_close(chunked, F.cross_entropy(logits, plain.masks), rtol=1e-5, atol=1e-6)
    checkpointed.model.train()
    checkpointed()  # one whole step runs
