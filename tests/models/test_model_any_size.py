"""Every model family × every attention variant takes any input size and trains (issue 3)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from segattn.attention import available_attention
from segattn.models import available_models

SIZES = [(96, 160), (100, 150)]  # non-square; 100×150 is not a multiple of 32 (or 16)


@pytest.mark.parametrize("attention", available_attention())
@pytest.mark.parametrize("name", available_models())
def test_forward_backward_any_size(build_tiny, name: str, attention: str) -> None:
    torch.manual_seed(0)
    model = build_tiny(name, attention, aux_head=True).train()
    for height, width in SIZES:
        model.zero_grad(set_to_none=True)
        images = torch.randn(1, 3, height, width)
        target = torch.randint(0, 3, (1, height, width))
        logits, aux = model.forward_with_aux(images)
        assert logits.shape == (1, 3, height, width)
        assert aux is not None and aux.shape == (1, 3, height, width)
        (F.cross_entropy(logits, target) + model.aux_weight * F.cross_entropy(aux, target)).backward()
        for pname, param in model.named_parameters():
            assert param.grad is not None, f"{name}/{attention} {height}×{width}: {pname} got no gradient"
            assert torch.isfinite(param.grad).all(), (
                f"{name}/{attention} {height}×{width}: {pname} grad not finite"
            )


@pytest.mark.parametrize("name", available_models())
def test_pads_to_stride_and_crops_back(build_tiny, name: str) -> None:
    """forward(x) is by definition the model applied to x zero-padded right/bottom to the stride, cropped."""
    torch.manual_seed(0)
    model = build_tiny(name).eval()
    images = torch.randn(1, 3, 100, 150)
    stride = model.stride
    padded = F.pad(images, (0, -150 % stride, 0, -100 % stride))
    assert padded.shape[-2] % stride == 0 and padded.shape[-1] % stride == 0
    with torch.no_grad():
        expected = model(padded)[..., :100, :150]
        logits = model(images)
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-6)
    assert model.forward_with_aux(images)[1] is None  # no aux head configured


def test_vit_outputs_follow_out_indices(build_tiny) -> None:
    model = build_tiny("vit", depth=4, out_indices=[0, -1], head="mlp")
    features = model.encoder(torch.randn(1, 3, 32, 48))
    assert model.encoder.out_indices == [0, 3]
    assert [tuple(f.shape) for f in features] == [(1, 32, 2, 3), (1, 32, 2, 3)]


def test_an_image_at_a_multiple_of_the_stride_is_not_copied_except_in_a_trace(build_tiny) -> None:
    """Eager: no padding needed, no copy. Traced: the pad stays in the graph, so the traced function pads
    an image of another size."""
    model = build_tiny("pvt").eval()
    images = torch.randn(1, 3, 64, 96)
    assert model.pad_to_stride(images) is images
    assert model.pad_to_stride(torch.randn(1, 3, 65, 96)).shape[-2:] == (96, 96)
    traced = torch.jit.trace(lambda x: model.pad_to_stride(x), images)
    assert traced(torch.randn(1, 3, 65, 70)).shape[-2:] == (96, 96)
