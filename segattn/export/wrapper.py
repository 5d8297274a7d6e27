"""What every format exports: the model behind a tensor-in / tensor-out wrapper."""

from __future__ import annotations

from torch import Tensor, nn


class ExportWrapper(nn.Module):
    """Tensor in, tensor out: normalised images [B, 3, H, W] -> float32 logits [B, K, H, W]."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: Tensor) -> Tensor:
        return self.model(images).float()
