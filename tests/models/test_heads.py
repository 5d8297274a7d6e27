"""The SegFormer head's reordered computation equals the published one (upsample, concat, 1×1 fusion)."""

import torch
import torch.nn.functional as F

from segattn.models.heads import MLPHead


def published_mlp_head(head: MLPHead, features: list[torch.Tensor]) -> torch.Tensor:
    """Xie et al. 2021 as written: project each level, upsample to the first, concatenate, fuse, classify."""
    size = features[0].shape[-2:]
    levels = [
        F.interpolate(proj(feature), size=size, mode="bilinear", align_corners=False)
        for proj, feature in zip(head.proj, features, strict=True)
    ]
    return head.classifier(head.dropout(head.fuse(torch.cat(levels, dim=1))))


def test_mlp_head_equals_the_published_order_with_gradients() -> None:
    torch.manual_seed(0)
    channels = [8, 16, 24, 32]
    head = MLPHead(channels, num_classes=5, channels=12, dropout=0.0).double().train()
    for param in head.parameters():  # no trivial zero biases / unit BN
        torch.nn.init.normal_(param)
    features = [  # odd sizes: upsampling is not an exact 2×
        torch.randn(2, c, 15 // 2**i + 1, 21 // 2**i + 1, dtype=torch.float64, requires_grad=True)
        for i, c in enumerate(channels)
    ]
    ours, published = head(features), published_mlp_head(head, features)
    assert (ours - published).abs().max() <= 1e-12 * published.abs().max()
    upstream = torch.randn_like(ours)
    inputs = [*features, *head.parameters()]
    grads = torch.autograd.grad(ours, inputs, upstream)
    expected = torch.autograd.grad(published, inputs, upstream)
    for grad, want in zip(grads, expected, strict=True):
        assert (grad - want).abs().max() <= 1e-11 * want.abs().max().clamp_min(1.0)
