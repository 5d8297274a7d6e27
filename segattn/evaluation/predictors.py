"""The model under evaluation as one function: normalised images [B, 3, H, W] -> fp32 logits [B, K, H, W].

``TrainedModel.run`` predicts them: in torch through ``infer`` (exactly what validation runs) for a
train.py checkpoint or a safetensors export, in onnxruntime with the same window geometry for an ONNX
export, so the deployed artifact is scored by the same metric code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..inference.trained import TrainedModel

Predictor = Callable[[Tensor], Tensor]


def predictor(model: TrainedModel, inference: dict[str, Any]) -> Predictor:
    """``model.run`` with the ``inference`` group's settings on tensors; settings it cannot run (an ONNX
    model with multi-scale testing) are refused here, before the first image, naming the key."""
    settings = model.settings(**inference)

    def predict(images: Tensor) -> Tensor:
        return torch.from_numpy(model.run(images.numpy(), **settings))

    return predict
