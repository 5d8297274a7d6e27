"""Tiny models and metadata for the export and inference tests (a plain module: test files stay unique)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from segattn.attention import attention_options
from segattn.images import IMAGENET_MEAN, IMAGENET_STD
from segattn.inference.trained import TrainedModel
from segattn.models import build_model
from segattn.record import ModelRecord

CLASSES = ["background", "thing", "stuff"]
PALETTE = [(0, 0, 0), (255, 0, 0), (0, 0, 255)]
MEAN = list(IMAGENET_MEAN)
STD = list(IMAGENET_STD)
SIZE = (32, 32)  # export size: a 4 × 4 token grid at patch 8
SECOND = (2, 3, 27, 45)  # batch 2, non-square, not a multiple of the patch: padding and resampling run


def tiny_options(name: str) -> dict[str, Any]:
    """Shrink the variants whose defaults hold large tensors (Linformer's E, F over 4096 positions)."""
    return {"max_tokens": 64, "proj_len": 8} if "max_tokens" in attention_options(name) else {}


def tiny_model(name: str, seed: int = 0) -> nn.Module:
    """A one-block ViT (dim 16, 2 heads, patch 8) with attention ``name``, random weights, eval mode."""
    torch.manual_seed(seed)
    model = build_model(
        "vit",
        num_classes=len(CLASSES),
        attention=name,
        attention_options=tiny_options(name),
        embed_dim=16,
        depth=1,
        num_heads=2,
        patch_size=8,
        img_size=SIZE[0],
    )
    return model.eval()


def tiny_record(model: nn.Module) -> ModelRecord:
    """The record of a model built in a test."""
    return ModelRecord(model.config, CLASSES, PALETTE, dataset="synthetic")


def tiny_opened(model: nn.Module) -> TrainedModel:
    """A model built in a test as ``open_model`` returns it (its path names no file)."""
    return TrainedModel(tiny_record(model), Path(""), "test", network=model)


def tiny_exports(root: Path, seed: int) -> dict[str, Path]:
    """A tiny linear-attention model exported into ``root`` as safetensors (``st/``), ONNX
    (``onnx/model.onnx``) and TorchScript (``ts/model.pt``): the forms predict opens; {format: path}."""
    from segattn.export import export

    model = tiny_model("linear", seed=seed)
    export(model, tiny_record(model), "safetensors", root / "st", size=(32, 32))
    export(model, tiny_record(model), "onnx", root / "onnx", size=(32, 32))
    export(model, tiny_record(model), "torchscript", root / "ts", size=(32, 32))
    return {
        "safetensors": root / "st",
        "onnx": root / "onnx" / "model.onnx",
        "torchscript": root / "ts" / "model.pt",
    }
