"""model=efficientvit with attention=litemla is timm's EfficientViT-B: its weights load with no key missing
or left over and give timm's stage features; checkpointing keeps BatchNorm statistics; layer ids."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import timm
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from segattn.models import build_model
from segattn.models.blocks import AttentionSpec
from segattn.models.efficientvit import create_efficientvit


def num_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def timm_b0() -> torch.nn.Module:
    """A randomly initialised timm efficientvit_b0 whose BatchNorm layers are moved off their identity init
    (running mean 0, var 1, weight 1, bias 0), so that a wrong statistic or affine term would show."""
    torch.manual_seed(0)
    model = timm.create_model("efficientvit_b0", pretrained=False)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.normal_(0.0, 0.1)
                module.running_var.uniform_(0.5, 2.0)
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0.0, 0.1)
    return model.eval()


@pytest.fixture(scope="module")
def timm_weights(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    reference = timm_b0()
    path = tmp_path_factory.mktemp("efficientvit") / "efficientvit_b0.safetensors"
    save_file({k: v.contiguous() for k, v in reference.state_dict().items()}, path)
    return reference, path


def test_timm_b0_weights_load_and_give_timm_features(timm_weights) -> None:
    reference, path = timm_weights
    model = build_model("efficientvit", 3, attention="litemla", pretrained=str(path)).eval()
    encoder = model.encoder
    converted = encoder.convert_state_dict(reference.state_dict())
    assert set(converted) == set(encoder.state_dict())  # nothing missing, nothing left over
    assert num_params(encoder) == num_params(reference) - num_params(reference.head)
    images = torch.randn(2, 3, 96, 160)
    with torch.no_grad():
        expected = reference.forward_intermediates(images, intermediates_only=True)
        features = encoder(images)
    assert [f.shape[1] for f in features] == encoder.out_channels == [16, 32, 64, 128]
    # float32: measured max |Δ| = 0 (same ops in the same order) on stage outputs of magnitude 0.5-1.2;
    # the tolerance leaves room for other BLAS / oneDNN builds
    for ours, theirs in zip(features, expected, strict=True):
        assert theirs.abs().max() > 0.5
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)


def test_timm_weights_do_not_fit_another_attention_and_say_what_is_left(timm_weights) -> None:
    _, path = timm_weights
    with pytest.raises(
        ValueError, match=r"does not fit the EfficientViT encoder: missing \[.*attn\.qkv\.bias"
    ):
        build_model("efficientvit", 3, attention="flatten", pretrained=str(path))


def test_checkpointing_updates_batch_norm_statistics_once(build_tiny) -> None:
    torch.manual_seed(0)
    plain = build_tiny("efficientvit", "litemla", dropout=0.0).train()
    checkpointed = copy.deepcopy(plain)
    checkpointed.set_grad_checkpointing(True)
    images, target = torch.randn(2, 3, 64, 96), torch.randint(0, 3, (2, 64, 96))
    for model in (plain, checkpointed):
        F.cross_entropy(model(images), target).backward()
    buffers = dict(checkpointed.named_buffers())
    for name, buffer in plain.named_buffers():
        torch.testing.assert_close(buffers[name], buffer, rtol=1e-5, atol=1e-6, msg=name)


def test_layer_ids_run_from_the_stem_to_the_last_block() -> None:
    encoder = create_efficientvit(AttentionSpec("litemla"), size="b0")
    ids = [encoder.layer_id(name) for name, _ in encoder.named_parameters()]
    assert ids[0] == 0 and ids == sorted(ids)
    # stages 1-2: a downsampling block + depth - 1; stages 3-4: a downsampling block + depth attention blocks
    assert max(ids) == encoder.num_layers - 1 == 2 + 2 + 3 + 3
