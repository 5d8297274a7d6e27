"""python -m segattn.export: clear failures for variants that cannot export, and train → export → predict."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from export_fixtures import tiny_model, tiny_record
from PIL import Image

from segattn.attention import ATTENTION_REGISTRY, AttentionBase
from segattn.checkpoints.loading import save_exported
from segattn.export import main

REPO = Path(__file__).resolve().parents[2]


class SingularValueAttention(AttentionBase):
    """Mixes with singular values: neither ONNX exporter has an SVD, so the export must fail cleanly."""

    def mix(self, q, k, v, hw):
        return q * torch.linalg.svdvals(k.transpose(-2, -1) @ v).sum(-1, keepdim=True).unsqueeze(-2)


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(ATTENTION_REGISTRY, "svd", SingularValueAttention)


def exported_dir(name: str, path: Path) -> Path:
    model = tiny_model(name)
    save_exported(model, tiny_record(model), path)
    return path


def test_variant_that_cannot_export_fails_with_a_message_naming_it(registered, tmp_path, capsys):
    args = [
        f"checkpoint={exported_dir('svd', tmp_path / 'svd')}",
        f"out={tmp_path / 'out'}",
        "height=32",
        "width=32",
    ]
    assert main([*args, "format=onnx"]) == 1
    err = capsys.readouterr().err
    assert "attention 'svd' cannot be exported to ONNX" in err and "svd" in err and "Traceback" not in err
    assert not (tmp_path / "out" / "model.onnx").exists()


def test_export_says_what_it_exports_before_it_starts(registered, tmp_path, capsys):
    checkpoint = exported_dir("svd", tmp_path / "svd")
    main([f"checkpoint={checkpoint}", f"out={tmp_path / 'out'}", "height=32", "width=32", "format=onnx"])
    out = capsys.readouterr().out  # the export fails, after the line
    assert f"exporting {checkpoint} as onnx to {tmp_path / 'out'} at 32x32, then checking it" in out


def run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.slow
def test_checkpoint_from_train_py_exports_and_predicts_end_to_end(tmp_path):
    run_dir = tmp_path / "run"
    train = run(
        "train.py",
        "attention=linear",
        "logger=none",
        "trainer=cpu",
        "trainer.max_epochs=1",
        "callbacks.rich_progress_bar=null",
        "callbacks.rich_model_summary=null",
        "callbacks.wandb_panel=null",
        "data.image_size=[32,32]",
        "data.crop_size=[32,32]",
        "data.num_train=8",
        "data.num_val=2",
        "data.num_test=2",
        "data.batch_size=4",
        "data.val_batch_size=2",
        "model=vit",  # the overrides below are ViT options; the default model is pvt
        "model.embed_dim=16",
        "model.depth=1",
        "model.num_heads=2",
        "model.patch_size=8",
        "model.head_channels=16",
        f"hydra.run.dir={run_dir}",
        f"paths.log_dir={tmp_path}",
    )
    assert train.returncode == 0, train.stdout[-2000:] + train.stderr[-2000:]
    ckpt = run_dir / "checkpoints" / "last.ckpt"

    export = run(
        "-m",
        "segattn.export",
        f"checkpoint={ckpt}",
        "format=onnx",
        f"out={tmp_path / 'onnx'}",
        "height=32",
        "width=32",
    )
    assert export.returncode == 0, export.stdout[-2000:] + export.stderr[-2000:]
    assert "max abs diff" in export.stdout and (tmp_path / "onnx" / "model.onnx").is_file()

    images = tmp_path / "images"
    images.mkdir()
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (45, 61, 3), dtype=np.uint8)).save(images / "scene.png")
    masks = {}
    for kind, model in (("onnx", tmp_path / "onnx" / "model.onnx"), ("ckpt", ckpt)):
        out = tmp_path / f"pred_{kind}"
        predict = run("-m", "segattn.predict", f"checkpoint={model}", f"input={images}", f"out={out}")
        assert predict.returncode == 0, predict.stderr[-2000:]
        masks[kind] = np.asarray(Image.open(out / "masks" / "scene.png"))
        assert masks[kind].shape == (45, 61) and masks[kind].max() < 5  # synthetic data has 5 classes
        assert (out / "overlays" / "scene.png").is_file()
    assert (masks["onnx"] == masks["ckpt"]).mean() > 0.999
