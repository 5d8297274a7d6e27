"""Every attention variant, alone and inside every model family, stays finite under bf16 and fp16 autocast
at 16,384 tokens per attention layer (a 128×128 grid) with large-magnitude inputs, and trains: bf16 steps
all apply; fp16 runs with a GradScaler, which may skip overflowing steps but must apply some. Autocast and
the scaler come from Lightning's MixedPrecision plugin, as in ``trainer.precision=bf16-mixed / 16-mixed``
(Lightning itself swaps 16-mixed for bf16-mixed on CPU, so the plugin is driven directly here)."""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.plugins.precision import MixedPrecision
from reliability_fixtures import BASE, VIT, compose_run

from segattn.attention import attention_options, available_attention, build_attention
from segattn.data import SegDataModule
from segattn.models import build_model
from segattn.training.guards import NonFiniteGuard
from segattn.training.run import build_module, plain

GRID = (128, 128)  # 16,384 tokens
MAGNITUDE = 100.0  # inputs ~ N(0, 100²): q·kᵀ logits in the thousands, exp() far beyond fp16's 65504
HALF = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}
# The model families with their first attention stage at 128×128 tokens, at tiny widths.
FAMILIES = {
    "vit": (128, {"embed_dim": 16, "depth": 1, "num_heads": 2, "patch_size": 1, "img_size": 128}),
    "pvt": (512, {"embed_dims": [16, 16, 16, 16], "depths": [1, 1, 1, 1], "num_heads": [2, 1, 1, 1]}),
    "unet": (512, {"encoder": "test_resnet"}),
}
# fp16 is emulated (slow) on CPUs, so each variant trains in fp16 in one family: the sub-quadratic ones in
# the ViT (its patch-1 embedding is cheap), softmax in the PVT (PVTv2's spatially reduced form; a full
# 16k² softmax step in fp16 takes ~10 s on 2 cores, and it is covered at the attention level above).
FP16_PAIRS = [("vit", name) for name in available_attention() if name != "softmax"]
FP16_PAIRS += [("pvt", "softmax"), ("unet", "linear")]


def options(name: str) -> dict:
    """Linformer's projections must cover the 128×128 grid; a short projection keeps them small."""
    accepted = attention_options(name)
    return {"max_tokens": GRID[0] * GRID[1], "proj_len": 16} if "max_tokens" in accepted else {}


def amp(precision: str, init_scale: float = 2.0**16) -> MixedPrecision:
    """Lightning's plugin for ``precision`` on the CPU; fp16 gets a GradScaler (Lightning's default scale)."""
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale) if precision == "16-mixed" else None
    return MixedPrecision(precision, "cpu", scaler)


@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("name", available_attention())
def test_attention_at_16k_tokens_is_finite_and_close_to_fp32(name, precision):
    torch.manual_seed(0)
    attention = build_attention(name, 8, 1, **options(name)).eval()  # eval: Performer keeps its features
    x = torch.randn(1, GRID[0] * GRID[1], 8) * MAGNITUDE
    with torch.no_grad():
        reference = attention(x, GRID)
    backward = precision == "bf16-mixed" and not attention.quadratic
    x.requires_grad_(backward)
    with amp(precision).forward_context():
        out = attention(x, GRID)
    assert out.dtype == HALF[precision] and torch.isfinite(out).all()
    error = ((out.float() - reference).norm() / reference.norm()).item()
    assert error < {"bf16-mixed": 0.2, "16-mixed": 0.05}[precision], error  # measured ≤ 0.09 and ≤ 0.024
    if backward:
        # fp16 backward runs in the model tests below, under the GradScaler (fp16 weight gradients summed over
        # 16k tokens of such raw inputs exceed 65504: fp32 values up to 2.4e4 measured for Performer); the
        # quadratic variants' 16k-token backward (~10 s here) runs in the ViT training test below.
        out.float().square().mean().backward()
        assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
        assert all(torch.isfinite(param.grad).all() for param in attention.parameters())


def train_steps(model: torch.nn.Module, size: int, precision: str, steps: int) -> int:
    """``steps`` AdamW steps on large-magnitude images the way Lightning's precision plugin runs them;
    asserts the loss and weights stay finite and returns how many steps the optimizer applied."""
    plugin = amp(precision)
    scaler = plugin.scaler or torch.amp.GradScaler("cpu", enabled=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    # Channels-last images, so every convolution runs channels-last: on a CPU without native bf16 an NCHW
    # bf16 convolution takes PyTorch's reference im2col path instead of oneDNN's.
    images = (torch.randn(1, 3, size, size) * MAGNITUDE).contiguous(memory_format=torch.channels_last)
    masks = torch.randint(0, 3, (1, size, size))
    applied = 0
    for _ in range(steps):
        with plugin.forward_context():
            logits = model(images)
            loss = F.cross_entropy(logits, masks)
        assert torch.isfinite(logits).all() and torch.isfinite(loss), loss
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        applied += all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        scaler.step(optimizer)  # skipped by the scaler when a gradient overflowed
        scaler.update()
        optimizer.zero_grad()
    assert all(torch.isfinite(p).all() for p in model.parameters())
    return applied


def tiny_model(family: str, name: str) -> tuple[torch.nn.Module, int]:
    torch.manual_seed(0)
    size, family_options = FAMILIES[family]
    model = build_model(
        family, 3, attention=name, attention_options=options(name), head_channels=16, **family_options
    )
    return model.train(), size


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", available_attention())
def test_every_family_and_variant_trains_in_bf16_at_16k_tokens(family, name):
    model, size = tiny_model(family, name)
    assert train_steps(model, size, "bf16-mixed", steps=2) == 2


@pytest.mark.slow
@pytest.mark.parametrize(("family", "name"), FP16_PAIRS)
def test_fp16_with_grad_scaler_trains_at_16k_tokens(family, name):
    model, size = tiny_model(family, name)
    before = [p.detach().clone() for p in model.parameters()]
    assert train_steps(model, size, "16-mixed", steps=2) >= 1
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))


@pytest.mark.parametrize("precision", HALF)
def test_trainer_in_mixed_precision_with_the_guard_on(tmp_path, precision):
    """Our LightningModule in a real Trainer with a guard that would stop at the first skip: fp16 starts at
    a loss scale of 2^40, so scaled gradients overflow and the GradScaler skips steps and backs off; the
    guard leaves that to the scaler. In bf16 nothing is skipped."""
    cfg = compose_run(tmp_path, *BASE, *VIT, "logger=none")
    datamodule = SegDataModule(**plain(cfg.data))
    guard = NonFiniteGuard(max_consecutive=1, max_total=1)
    plugin = amp(precision, init_scale=2.0**40)
    trainer = pl.Trainer(
        accelerator="cpu", max_steps=4, plugins=[plugin], callbacks=[guard], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        limit_val_batches=0, gradient_clip_val=1.0,
    )  # fmt: skip
    trainer.fit(build_module(cfg, datamodule), datamodule=datamodule)
    assert trainer.global_step == 4 and guard.total == 0
    if precision == "16-mixed":
        assert plugin.scaler.get_scale() < 2.0**40  # the scaler did skip overflowing steps
