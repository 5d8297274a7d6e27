"""Gradient checkpointing recomputes blocks (and PVT's patch embeddings and the heads) in backward and leaves
every output and gradient unchanged."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from segattn.layers.recompute import reused
from segattn.models import Segmentor
from segattn.models.blocks import recompute_in_backward


def watched_modules(model: Segmentor, name: str) -> list[nn.Module]:
    """Early modules inside checkpointed segments: the recompute in backward stops once the saved tensors
    are rebuilt, so a hook on a segment's last module (or on the segment itself) need not fire again."""
    if name == "vit":
        return [model.encoder.blocks[0].attn]
    if name == "pvt":  # a block, the stem and a stage's patch embedding, the SegFormer head
        encoder = model.encoder
        heads = [model.head.fuse.bn] + ([model.aux_head.conv] if model.aux_head is not None else [])
        return [
            encoder.stages[0].blocks[0].attn,
            encoder.patch_embed.proj,
            encoder.stages[1].downsample.proj,
            *heads,
        ]
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
    logits, aux = model.forward_with_aux(images)
    loss = F.cross_entropy(logits, target) + (0 if aux is None else F.cross_entropy(aux, target))
    loss.backward()
    for handle in handles:
        handle.remove()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    grads["logits"], grads["aux"] = logits.detach(), None if aux is None else aux.detach()
    return grads, [calls.count(i) for i in range(len(handles))]


@pytest.mark.parametrize(
    ("name", "options"),
    [("vit", {}), ("pvt", {}), ("pvt", {"aux_head": True}), ("unet", {}), ("efficientvit", {})],
)
def test_checkpointing_recomputes_and_keeps_gradients(build_tiny, name: str, options: dict) -> None:
    """Same logits (main and auxiliary), parameter gradients and BatchNorm statistics with and without
    checkpointing; the watched modules run again in backward."""
    torch.manual_seed(0)
    plain = build_tiny(name, "flatten", dropout=0.0, **options).train()
    checkpointed = copy.deepcopy(plain)
    checkpointed.set_grad_checkpointing(True)
    images, target = torch.randn(2, 3, 64, 96), torch.randint(0, 3, (2, 64, 96))
    expected, plain_calls = gradients_and_calls(plain, name, images, target)
    grads, checkpointed_calls = gradients_and_calls(checkpointed, name, images, target)
    assert all(count == 1 for count in plain_calls)
    assert all(count == 2 for count in checkpointed_calls), "blocks were not recomputed in backward"
    for pname, grad in expected.items():
        torch.testing.assert_close(grads[pname], grad, rtol=1e-5, atol=1e-6, msg=pname)
    assert (expected["aux"] is None) != bool(options)
    buffers = dict(checkpointed.named_buffers())  # BatchNorm statistics updated once, not again in backward
    for bname, buffer in plain.named_buffers():
        torch.testing.assert_close(buffers[bname], buffer, rtol=1e-5, atol=1e-6, msg=bname)


def test_build_option_switches_checkpointing_on(build_tiny) -> None:
    model = build_tiny("pvt", grad_checkpointing=True)
    assert all(block.grad_checkpointing for stage in model.encoder.stages for block in stage.blocks)


def test_compiled_checkpointing_keeps_gradients_and_statistics(build_tiny) -> None:
    """``model.compile`` with ``model.grad_checkpointing``: the compiled graphs recompute in their own way
    (plain ``checkpoint``, no eager recompute contexts) with eager mode's gradients and BatchNorm statistics
    updated once."""
    torch.manual_seed(0)
    plain = build_tiny("pvt", "flatten", dropout=0.0).train()
    compiled = copy.deepcopy(plain)
    compiled.set_grad_checkpointing(True)
    compiled.compile(backend="aot_eager")
    images, target = torch.randn(2, 3, 64, 96), torch.randint(0, 3, (2, 64, 96))
    for model in (plain, compiled):
        F.cross_entropy(model(images), target).backward()
    grads = dict(compiled.named_parameters())
    for name, parameter in plain.named_parameters():
        torch.testing.assert_close(grads[name].grad, parameter.grad, rtol=1e-5, atol=1e-6, msg=name)
    buffers = dict(compiled.named_buffers())
    for name, buffer in plain.named_buffers():
        torch.testing.assert_close(buffers[name], buffer, rtol=1e-5, atol=1e-6, msg=name)


class TwoReusedScales(nn.Module):
    """x · a · b, where a and b come from ``reused``: in a checkpointed forward they are computed once and
    given back in order to the recompute."""

    def __init__(self) -> None:
        super().__init__()
        self.computed: list[str] = []

    def scale(self, name: str, value: float) -> torch.Tensor:
        self.computed.append(name)
        return torch.tensor(value)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = reused(lambda: self.scale("a", 2.0))
        b = reused(lambda: self.scale("b", 3.0))
        return (x * a).sin() * b


def test_a_recompute_gets_the_forwards_reused_values_back_in_order() -> None:
    module = TwoReusedScales()
    x = torch.randn(5, requires_grad=True)
    (grad,) = torch.autograd.grad(recompute_in_backward(True, module, x).sum(), x)
    assert module.computed == ["a", "b"]  # not again in backward
    torch.testing.assert_close(grad, 6 * torch.cos(2 * x))
    assert reused(lambda: 7) == 7  # outside a checkpointed segment: computed
