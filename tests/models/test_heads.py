"""The SegFormer head's reordered computation equals the published one (upsample, concat, 1×1 fusion)."""

import copy
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

from segattn.layers import KERNEL_ENV
from segattn.layers.fast_path import paths_of_a_gpu
from segattn.models import heads
from segattn.models.heads import MLPHead, ReluClassifier

LEVEL_CHANNELS = [8, 16, 24, 32]


def published_mlp_head(head: MLPHead, features: list[torch.Tensor]) -> torch.Tensor:
    """Xie et al. 2021 as written: project each level, upsample to the first, concatenate, fuse (conv, BN,
    ReLU), classify."""
    size = features[0].shape[-2:]
    levels = [
        F.interpolate(proj(feature), size=size, mode="bilinear", align_corners=False)
        for proj, feature in zip(head.proj, features, strict=True)
    ]
    return head.classifier(head.dropout(F.relu(head.fuse(torch.cat(levels, dim=1)))))


def random_head(channels: int, dropout: float, dtype: torch.dtype) -> MLPHead:
    """An MLPHead on ``LEVEL_CHANNELS`` with every parameter and BN statistic random (no zero biases or unit
    BN that would hide a mistake)."""
    head = MLPHead(LEVEL_CHANNELS, num_classes=5, channels=channels, dropout=dropout).to(dtype)
    with torch.no_grad():
        for param in head.parameters():
            torch.nn.init.normal_(param)
        head.fuse.bn.running_mean.normal_()
        head.fuse.bn.running_var.uniform_(0.5, 1.5)
    return head


def level_features(dtype: torch.dtype, batch: int = 2) -> list[torch.Tensor]:
    """Features of odd sizes (upsampling is not an exact 2×), shallow to deep."""
    return [
        torch.randn(batch, c, 15 // 2**i + 1, 21 // 2**i + 1, dtype=dtype, requires_grad=True)
        for i, c in enumerate(LEVEL_CHANNELS)
    ]


def upsample_form(head: MLPHead, features: list[torch.Tensor]) -> torch.Tensor:
    """``head`` on ``features`` on the opt-in ``upsample`` form (SEGATTN_KERNEL=upsample) as a CUDA device
    takes it (``paths_of_a_gpu``; the form is PyTorch matmuls, so it runs on the CPU too), which never
    calls ``resized``."""
    head.kernel_backend = "upsample"
    with paths_of_a_gpu(), mock.patch.object(heads, "resized", side_effect=AssertionError("resized")):
        return head(features)


def outputs_and_grads(
    forward, head: MLPHead, features: list[torch.Tensor], upstream: torch.Tensor | None, seed: int
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    torch.manual_seed(seed)  # the same Dropout2d draw for both
    out = forward(head, features)
    upstream = torch.randn_like(out) if upstream is None else upstream
    return out, torch.autograd.grad(out, [*features, *head.parameters()], upstream)


def assert_close(ours: torch.Tensor, want: torch.Tensor, rtol: float) -> None:
    assert (ours.double() - want.double()).abs().max() <= rtol * want.double().abs().max().clamp_min(1.0)


# head widths 12: levels of 8 channels stacked narrow, 16-32 projected wide; 40: all narrow; 4: all wide
@pytest.mark.parametrize("channels", [12, 40, 4])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_mlp_head_equals_the_published_order_with_gradients(
    channels: int, training: bool, dtype: torch.dtype
) -> None:
    torch.manual_seed(0)
    ours_head = random_head(channels, dropout=0.3, dtype=dtype).train(training)
    published_head = copy.deepcopy(ours_head)
    features = level_features(dtype)
    upstream = torch.randn(2, 5, 16, 22, dtype=dtype)
    ours, ours_grads = outputs_and_grads(MLPHead.__call__, ours_head, features, upstream, seed=1)
    want, want_grads = outputs_and_grads(published_mlp_head, published_head, features, upstream, seed=1)
    rtol = 1e-12 if dtype == torch.float64 else 1e-5
    assert_close(ours, want, rtol)
    for grad, expected in zip(ours_grads, want_grads, strict=True):
        assert_close(grad, expected, 10 * rtol)
    for name, buffer in published_head.fuse.bn.named_buffers():  # BN's running statistics updated alike
        assert_close(getattr(ours_head.fuse.bn, name), buffer, rtol)


@pytest.mark.parametrize("channels", [12, 4])
def test_mlp_head_equals_the_published_order_on_channels_last_grids(channels: int) -> None:
    """Features as PVT hands them over, channels last, one image: the sum of the wide levels then has
    batch stride C, a layout whose BatchNorm gradients torch's CPU kernel gets wrong when the output
    gradient comes in another."""
    torch.manual_seed(0)
    head = random_head(channels, dropout=0.0, dtype=torch.float64).train()
    features = [
        feature.detach().contiguous(memory_format=torch.channels_last).requires_grad_()
        for feature in level_features(torch.float64, batch=1)
    ]
    upstream = torch.randn(1, 5, 16, 22, dtype=torch.float64)
    ours, ours_grads = outputs_and_grads(MLPHead.__call__, head, features, upstream, seed=1)
    want, want_grads = outputs_and_grads(published_mlp_head, copy.deepcopy(head), features, upstream, seed=1)
    assert_close(ours, want, 1e-12)
    for grad, expected in zip(ours_grads, want_grads, strict=True):
        assert_close(grad, expected, 1e-11)


def test_mlp_head_dropout_zeroes_the_channels_dropout2d_draws() -> None:
    """With the fused map's dropout folded into the classifier, a dropped channel still reaches no logit."""
    torch.manual_seed(0)
    head = random_head(12, dropout=0.5, dtype=torch.float64).train()
    features = level_features(torch.float64)
    torch.manual_seed(3)
    keep = torch.nn.functional.dropout2d(torch.ones(2, 12, 1, 1, dtype=torch.float64), 0.5)
    torch.manual_seed(3)
    expected = published_mlp_head(copy.deepcopy(head), features)
    torch.manual_seed(3)
    ours = head(features)
    assert 0 < keep.count_nonzero() < keep.numel()  # the draw drops some channels and keeps some
    assert_close(ours, expected, 1e-12)


@pytest.mark.parametrize("training", [True, False])
def test_mlp_head_in_bf16_autocast_is_as_close_to_fp32_as_the_published_order(training: bool) -> None:
    """Under bf16 autocast both orders round; both stay within the same bound of the fp32 result: the
    logits within 4 bf16 epsilons (norm-wise), the gradients within 24 (a few ReLU inputs near zero flip
    sign under rounding, in the published order as much as in ours). So does the opt-in upsample form,
    which casts each level to bf16 before its two matmuls and rounds their intermediate and output."""
    torch.manual_seed(0)
    head = MLPHead(LEVEL_CHANNELS, num_classes=5, channels=12, dropout=0.3).train(training)
    with torch.no_grad():
        for param in head.parameters():
            param.normal_(0.0, 0.3)
        head.fuse.bn.weight.uniform_(0.5, 1.5)
    features = level_features(torch.float32)
    upstream = torch.randn(2, 5, 16, 22)
    exact, exact_grads = outputs_and_grads(published_mlp_head, copy.deepcopy(head), features, upstream, 1)
    exact_grads = torch.cat([grad.flatten() for grad in exact_grads])
    for forward in (MLPHead.__call__, published_mlp_head, upsample_form):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out, grads = outputs_and_grads(forward, copy.deepcopy(head), features, upstream, seed=1)
        grads = torch.cat([grad.float().flatten() for grad in grads])
        assert out.dtype == torch.bfloat16
        assert (out.float() - exact).norm() <= 4 * 2**-8 * exact.norm()
        assert (grads - exact_grads).norm() <= 24 * 2**-8 * exact_grads.norm()


@pytest.mark.parametrize("channels", [12, 40, 4])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("channels_last", [False, True])
def test_mlp_head_upsample_form_equals_the_default_path_in_fp32_with_gradients(
    channels: int, training: bool, channels_last: bool
) -> None:
    """The levels resampled as interpolation-matrix matmuls give the default path's logits, gradients and
    BN statistics within fp32 rounding (other summation orders): narrow, wide and mixed levels, NCHW and
    channels-last (as PVT hands them over) grids of odd sizes."""
    torch.manual_seed(0)
    head = random_head(channels, dropout=0.3, dtype=torch.float32).train(training)
    default = copy.deepcopy(head)
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    features = [
        feature.detach().contiguous(memory_format=memory_format).requires_grad_()
        for feature in level_features(torch.float32)
    ]
    upstream = torch.randn(2, 5, 16, 22)
    ours, ours_grads = outputs_and_grads(upsample_form, head, features, upstream, seed=1)
    want, want_grads = outputs_and_grads(MLPHead.__call__, default, features, upstream, seed=1)
    assert_close(ours, want, 1e-5)
    for grad, expected in zip(ours_grads, want_grads, strict=True):
        assert_close(grad, expected, 1e-4)
    for name, buffer in default.fuse.bn.named_buffers():
        assert_close(getattr(head.fuse.bn, name), buffer, 1e-5)


@pytest.mark.parametrize(
    ("kernel", "on_gpu", "on_cpu"),
    [
        ("auto", False, False),
        ("torch", False, False),
        ("loss", False, False),
        ("upsample", True, False),
        ("triton", True, True),  # the CPU under TRITON_INTERPRET=1 (conftest.py), as every Triton form
    ],
)
def test_mlp_head_takes_the_upsample_form_by_the_kernel_setting_it_was_built_under(
    kernel: str, on_gpu: bool, on_cpu: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SEGATTN_KERNEL=upsample or triton, read when the head is built: a CUDA device's levels skip
    ``resized`` (a call per level); the default ``auto`` keeps it, and a traced head under any setting."""
    monkeypatch.setenv(KERNEL_ENV, kernel)
    with paths_of_a_gpu():
        head = MLPHead(LEVEL_CHANNELS, num_classes=5, channels=12).eval()
    monkeypatch.delenv(KERNEL_ENV)
    features = [feature.detach() for feature in level_features(torch.float32)]

    def resized_calls(run) -> int:
        with mock.patch.object(heads, "resized", wraps=heads.resized) as resized:
            run()
        return resized.call_count

    with paths_of_a_gpu():
        assert resized_calls(lambda: head(features)) == (0 if on_gpu else len(LEVEL_CHANNELS))
        traced = resized_calls(lambda: torch.jit.trace(head, (features,), check_trace=False))
        assert traced == len(LEVEL_CHANNELS)
    assert resized_calls(lambda: head(features)) == (0 if on_cpu else len(LEVEL_CHANNELS))


def test_relu_classifier_gradients_match_finite_differences() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 6, 3, 5, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(2, 4, 6, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(ReluClassifier.apply, (x, weight, bias))


def test_mlp_head_state_dict_keys_are_the_published_modules() -> None:
    """Checkpoints and the Hugging Face converter address the head by these keys."""
    keys = set(MLPHead([8, 16], num_classes=3, channels=4).state_dict())
    assert keys == {
        *(f"proj.{i}.{p}" for i in range(2) for p in ("weight", "bias")),
        "fuse.conv.weight",
        *(f"fuse.bn.{p}" for p in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")),
        "classifier.weight",
        "classifier.bias",
    }
