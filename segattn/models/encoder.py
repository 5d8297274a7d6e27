"""The backbone protocol the Segmentor, the heads and the trainer rely on, instead of sniffing names."""

from __future__ import annotations

from torch import Tensor, nn

from .blocks import set_block_checkpointing


class Encoder(nn.Module):
    """Image [B, 3, H, W] → multi-level features, list of [B, out_channels[i], H / out_strides[i], W / ...].

    Inputs must be a multiple of ``stride`` (the Segmentor pads). ``layer_id`` numbers parameters from
    the input (0) to the output (``num_layers``) for layer-wise LR decay; ``convert_state_dict`` maps a
    timm checkpoint of the same family onto this module's names.
    """

    out_channels: list[int]
    out_strides: list[int]
    stride: int
    num_layers: int

    @property
    def attention_stride(self) -> int:
        """The finest stride at which a zoo attention layer sees this encoder's features: the first level
        by default (ViT, PVT, and UNet whose decoder attends at every level); ``max_tokens`` checks use it."""
        return min(self.out_strides)

    def forward(self, x: Tensor) -> list[Tensor]:
        raise NotImplementedError

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        set_block_checkpointing(self, enable)

    def no_weight_decay(self) -> set[str]:
        """Parameter names (beyond norms, biases and other 1-D tensors) that take no weight decay."""
        return set()

    def layer_id(self, name: str) -> int:
        """Depth index of parameter ``name``: 0 for the stem, ``num_layers`` for the last norm."""
        raise NotImplementedError

    def convert_state_dict(self, state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
        """A timm checkpoint of this family renamed to this module's parameter names."""
        return state_dict
