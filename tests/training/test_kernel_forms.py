"""A training step on every fast form at once equals the step on the PyTorch path. SEGATTN_KERNEL=triton
takes the attention, Mix-FFN (the ``ffn`` form), LayerNorm (with the ``residual`` form's adds), decode
head (``upsample``, ``head``) and loss operators, here through Triton's interpreter on the CPU; each is
tested against its formula in tests/layers, tests/attention and tests/training/test_fused_loss.py. This
holds them together in train.py's own module: the stages' bf16 maps into the head, the residual adds that
``run_blocks`` leaves pending across blocks and into a stage's norm, checkpointing, the fused loss on the
head's logits. A tiny PVT in fp32: the loss and every parameter's gradient, within 1e-4 of each
tensor's largest (summation orders differ) and 1e-8 (the last stage's norm bias gets none: the head's
BatchNorm removes a constant per channel, so both paths give rounding noise of 1e-9)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from operator_names import OperatorNames
from train_overrides import TINY_MODEL

from segattn.cli import compose_command
from segattn.config import plain
from segattn.data.datamodule import SegDataModule
from segattn.layers import KERNEL_ENV
from segattn.training.run import build_module

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
FORMS = {  # an operator of each form, forward and backward (eager attention runs its kernels undispatched)
    "mix_ffn",
    "mix_ffn_gelu_backward",
    "residual_layer_norm",
    "residual_layer_norm_backward",
    "norm_relu_classifier",
    "norm_relu_input_grad",
    "seg_loss_sums",
    "seg_loss_sums_backward",
}


@pytest.mark.usefixtures("exact_fp32")
def test_a_step_on_every_form_equals_the_pytorch_path(monkeypatch) -> None:
    """With gradient checkpointing: a block recomputed in backward keeps the add pending into it."""
    overrides = [
        *TINY_MODEL["pvt"],
        "model.depths=[2,1,1,1]",  # a residual add pending from one block into the next
        "attention=linear",
        "logger=none",
        "model.drop_path_rate=0",  # the paths draw their masks in different orders
        "model.dropout=0",
        "model.grad_checkpointing=true",
    ]
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(2, 3, 32, 64, generator=generator).to(DEVICE)
    results, operators = {}, {}
    for kernel in ("triton", "torch"):
        monkeypatch.setenv(KERNEL_ENV, kernel)
        cfg = compose_command("train", overrides)
        torch.manual_seed(0)
        module = build_module(cfg, SegDataModule(**plain(cfg.data))).to(DEVICE)
        masks = torch.randint(
            0, module.model.num_classes, (2, 32, 64), generator=torch.Generator().manual_seed(2)
        )
        with OperatorNames() as names:
            loss, _ = module.head_losses(images, masks.to(DEVICE))
            parameters = [p for p in module.parameters() if p.requires_grad]
            results[kernel] = [loss, *torch.autograd.grad(loss, parameters)]
        operators[kernel] = {name.split(".")[1] for name in names.names if name.startswith("segattn.")}
    assert operators["torch"] == set()
    assert operators["triton"] >= FORMS, FORMS - operators["triton"]
    names = ["loss", *(name for name, p in module.named_parameters() if p.requires_grad)]
    for name, got, want in zip(names, results["triton"], results["torch"], strict=True):
        scale = want.abs().max().item()
        torch.testing.assert_close(
            got, want, rtol=0, atol=1e-4 * scale + 1e-8, msg=lambda m, n=name: f"{n}: {m}"
        )
