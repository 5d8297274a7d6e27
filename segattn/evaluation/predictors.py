"""The model under evaluation as one function: normalised images [B, 3, H, W] -> fp32 logits [B, K, H, W].

A train.py checkpoint or an exported safetensors directory runs in torch through ``infer`` (exactly what
validation runs); an ONNX export runs in onnxruntime through ``infer_numpy`` with the same window
geometry, so the deployed artifact is scored by the same metric code. ``open_model`` opens all three.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..images import as_hw
from ..inference.infer import infer
from ..inference.onnx import infer_numpy
from ..inference.trained import TrainedModel

Predictor = Callable[[Tensor], Tensor]


def predictor(model: TrainedModel, inference: dict[str, Any]) -> Predictor:
    """``infer`` with the ``inference`` group's settings, without autograd; ``infer_numpy`` for an ONNX
    model, which takes no multi-scale testing (ValueError naming the key)."""
    num_classes, network, session = model.record.num_classes, model.network, model.session
    if session is None:

        def predict(images: Tensor) -> Tensor:
            with torch.inference_mode():
                return infer(network, images, num_classes, **inference).float()

        return predict
    if list(inference.get("scales") or [1.0]) != [1.0]:
        raise ValueError(
            f"inference.scales={list(inference['scales'])}: multi-scale testing runs on the torch path; "
            "evaluate the checkpoint or its safetensors export, or set inference.scales=[1.0]"
        )
    crop, stride = inference.get("crop"), inference.get("stride")

    def predict_onnx(images: Tensor) -> Tensor:
        logits = infer_numpy(
            session,
            images.numpy(),
            mode=inference.get("mode", "whole"),
            crop=None if crop is None else as_hw(crop, "inference.crop"),
            stride=None if stride is None else as_hw(stride, "inference.stride"),
            crop_batch_size=int(inference.get("crop_batch_size", 4)),
            flip=bool(inference.get("flip", False)),
        )
        return torch.from_numpy(logits).float()

    return predict_onnx
