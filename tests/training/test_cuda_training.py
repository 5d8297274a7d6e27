"""Training on a CUDA device: one step of every model family on the GPU (fp32, TF32 off) gives the CPU's
logits, loss and parameter gradients, and a bf16-mixed Lightning run with validation and a test pass
completes with finite scores and a checkpoint, also under ``trainer=fsdp`` (FSDP2 over NCCL, one GPU).

Skipped without a CUDA device: CI has none, so these run where a GPU is lent (`make device-check`;
docs/performance.md, "On a GPU").
"""

from __future__ import annotations

import copy
import math
import subprocess
import sys

import pytest
import torch
from train_overrides import QUIET, REPO, TINY_DATA, TINY_MODEL, compose_config

from segattn.inference.trained import open_model
from segattn.models.builder import build_model
from segattn.training.losses import SegLoss
from segattn.training.run import plain
from segattn.training.run import run as train

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.usefixtures("exact_fp32"),
]
LINEAR = ["efficient", "linear", "taylor", "flatten", "agent", "pola", "litemla"]
FP32 = {"rtol": 1e-4, "atol": 1e-5}  # against float64: summation order only
# LiteMLA divides by Σ ReLU(q)·ReLU(k) + 1e-5, which is near its eps wherever a query's ReLU is almost all
# zero: fp32 on the CPU is 3.1e-5 from float64 there at these widths, so the GPU is held to CPU fp32's bound
TOLERANCE = {"litemla": {"rtol": 1e-4, "atol": 1e-4}}


def step(model: torch.nn.Module, images: torch.Tensor, target: torch.Tensor) -> list[torch.Tensor]:
    """Logits, loss and every parameter gradient of one training step, as float64 on the CPU."""
    logits = model(images)
    loss = SegLoss(num_classes=model.num_classes, ignore_index=255)(logits, target)
    grads = torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad])
    return [t.detach().double().cpu() for t in (logits, loss, *grads)]


@pytest.mark.parametrize("family", sorted(TINY_MODEL))
@pytest.mark.parametrize("attention", LINEAR)
def test_cuda_step_equals_cpu_step(family: str, attention: str) -> None:
    cfg = compose_config([*TINY_MODEL[family], f"attention={attention}"])
    # Dropout and drop-path draw from different generators on the CPU and the GPU: off, so both compute
    # the same function.
    options = {k: 0.0 if k in ("dropout", "drop_path_rate") else v for k, v in plain(cfg.model).items()}
    del options["compile"]
    torch.manual_seed(0)
    model = build_model(
        **options,
        num_classes=5,
        attention=attention,
        attention_options=plain(cfg.attention.options),
    ).train()
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(2, 3, 48, 64, generator=generator)  # non-square, a multiple of every stride
    target = torch.randint(0, 5, (2, 48, 64), generator=generator)
    target[:, :4] = 255  # some ignored pixels

    expected = step(copy.deepcopy(model).double(), images.double(), target)
    actual = step(copy.deepcopy(model).cuda(), images.cuda(), target.cuda())
    names = ["logits", "loss", *(n for n, p in model.named_parameters() if p.requires_grad)]
    for name, a, e in zip(names, actual, expected, strict=True):
        tolerance = TOLERANCE.get(attention, FP32)
        torch.testing.assert_close(a, e, **tolerance, msg=lambda text, name=name: f"{name}: {text}")


@pytest.mark.parametrize("attention", ["flatten", "softmax"])
def test_bf16_mixed_run_on_cuda(tmp_path, attention: str) -> None:
    cfg = compose_config(
        [
            f"paths.log_dir={tmp_path}",
            f"paths.output_dir={tmp_path / 'run'}",
            *TINY_DATA,
            *TINY_MODEL["pvt"],
            *(o for o in QUIET if not o.startswith("trainer=")),
            "trainer=gpu",
            "trainer.precision=bf16-mixed",
            f"attention={attention}",
            "logger=none",
            "callbacks.wandb_panel=null",
            "trainer.max_epochs=2",
            "trainer.num_sanity_val_steps=0",
        ]
    )
    summary = train(cfg)
    assert summary["steps"] == 4
    assert all(math.isfinite(summary["final"][key]) for key in ("mIoU", "mAcc", "aAcc"))
    assert math.isfinite(summary["test"]["mIoU"])
    assert summary["best_checkpoint"] and (tmp_path / "run").is_dir()
    checkpoint = torch.load(summary["best_checkpoint"], map_location="cpu", weights_only=True)
    assert all(t.device.type == "cpu" for t in checkpoint["state_dict"].values())


def test_fsdp_run_on_one_gpu(tmp_path) -> None:
    """``trainer=fsdp`` (bf16-mixed, NCCL) trains, validates, tests and writes one full checkpoint that
    loads without Lightning. A subprocess: the run initialises a process group."""
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "train.py"),
            *TINY_DATA,
            *TINY_MODEL["pvt"],
            "trainer=fsdp",
            "trainer.devices=1",
            "trainer.max_epochs=1",
            "logger=none",
            "callbacks.rich_progress_bar=null",
            "callbacks.rich_model_summary=null",
            f"paths.log_dir={tmp_path}",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    opened = open_model(tmp_path / "run/checkpoints/last.ckpt")
    model = opened.network
    assert opened.record.family == "pvt"
    assert all(torch.isfinite(p).all() for p in model.parameters())
