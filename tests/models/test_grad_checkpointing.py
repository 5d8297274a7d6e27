"""Per-block gradient checkpointing recomputes blocks in backward and leaves every gradient unchanged."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from segattn.models import Segmentor


def watched_modules(model: Segmentor, name: str) -> list[nn.Module]:
    """Early modules inside checkpointed segments: the recompute in backward stops once the saved tensors
    are rebuilt, so a hook on a segment's last module (or on the segment itself) need not fire again."""
    if name == "vit":
        return [model.encoder.blocks[0].attn]
    if name == "pvt":
        return [model.encoder.stages[0].blocks[0].attn]
    if name == "efficientvit":  # a stride-4 MBConv block and an attention block
        return [
            model.encoder.stages[0].blocks[0].main.inverted_conv,
            model.encoder.stages[2].blocks[1].attn.qkv,
        ]
    return [model.encoder.model.layer2[0].conv1, model.head.attn_blocks[0].attn]


def gradients_and_calls(model: Segmentor, name: str, images: torch.Tensor, target: torch.Tensor):
    calls = []
    handles = [
        m.register_forward_hook(lambda *_, i=i: calls.append(i))
        for i, m in enumerate(watched_modules(model, name))
    ]
    F.cross_entropy(model(images), target).backward()
    for handle in handles:
        handle.remove()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return grads, [calls.count(i) for i in range(len(handles))]


@pytest.mark.parametrize("name", ["vit", "pvt", "unet", "efficientvit"])
def test_checkpointing_recomputes_and_keeps_gradients(build_tiny, name: str) -> None:
    torch.manual_seed(0)
    plain = build_tiny(name, "flatten", dropout=0.0).train()
    checkpointed = copy.deepcopy(plain)
    checkpointed.set_grad_checkpointing(True)
    images, target = torch.randn(2, 3, 64, 96), torch.randint(0, 3, (2, 64, 96))
    expected, plain_calls = gradients_and_calls(plain, name, images, target)
    grads, checkpointed_calls = gradients_and_calls(checkpointed, name, images, target)
    assert all(count == 1 for count in plain_calls)
    assert all(count == 2 for count in checkpointed_calls), "blocks were not recomputed in backward"
    for pname, grad in expected.items():
        torch.testing.assert_close(grads[pname], grad, rtol=1e-5, atol=1e-6, msg=pname)


def test_build_option_switches_checkpointing_on(build_tiny) -> None:
    model = build_tiny("pvt", grad_checkpointing=True)
    assert all(block.grad_checkpointing for stage in model.encoder.stages for block in stage.blocks)
