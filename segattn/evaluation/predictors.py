"""The model under evaluation as one function: normalised images [B, 3, H, W] -> fp32 logits [B, K, H, W].

A train.py checkpoint or an exported safetensors directory runs in torch through ``infer`` (exactly what
validation runs); an ONNX export runs in onnxruntime through ``infer_numpy`` with the same window
geometry, so the deployed artifact is scored by the same metric code.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.nn import Module

from ..checkpoints.loading import load_model
from ..inference.infer import infer
from ..inference.onnx import is_onnx

Predictor = Callable[[Tensor], Tensor]


def torch_predictor(model: Module, info: dict[str, Any], inference: dict[str, Any]) -> Predictor:
    """``infer`` with the validation settings, without autograd."""

    def predict(images: Tensor) -> Tensor:
        with torch.inference_mode():
            return infer(model, images, info["num_classes"], **inference).float()

    return predict


def onnx_predictor(path: Path, inference: dict[str, Any], threads: int) -> tuple[Predictor, dict[str, Any]]:
    from ..inference.onnx import OnnxSegmentor, infer_numpy

    if list(inference.get("scales") or [1.0]) != [1.0]:
        raise ValueError(
            f"validation.scales={list(inference['scales'])}: multi-scale testing runs on the torch path; "
            "evaluate the checkpoint or its safetensors export, or set validation.scales=[1.0]"
        )
    session = OnnxSegmentor(path, threads=threads)
    info = dict(session.info)
    info.setdefault("format", "onnx")
    info["path"] = str(session.path)
    crop, stride = inference.get("crop_size"), inference.get("stride")

    def predict(images: Tensor) -> Tensor:
        logits = infer_numpy(
            session,
            images.numpy(),
            mode=inference.get("mode", "whole"),
            crop_size=None if crop is None else tuple(crop),
            stride=None if stride is None else tuple(stride),
            crop_batch_size=int(inference.get("crop_batch_size", 4)),
            flip=bool(inference.get("flip", False)),
        )
        return torch.from_numpy(logits).float()

    return predict, info


def load_predictor(
    path: Path, inference: dict[str, Any], threads: int = 0
) -> tuple[Predictor, dict[str, Any], Module | None]:
    """(predict, info, model) for a checkpoint, an exported directory or an ONNX model; info as
    ``load_model``'s; model is the torch module (None for ONNX), which streamed rasters run directly."""
    if not path.exists():
        raise FileNotFoundError(
            f"checkpoint={path}: no such file or directory; expected a train.py .ckpt, an exported "
            "safetensors directory or a model.onnx"
        )
    if is_onnx(path):
        return (*onnx_predictor(path, inference, threads), None)
    model, info = load_model(path)
    return torch_predictor(model, info, inference), info, model
