"""UNet-style model: a timm CNN encoder and a decoder with an attention block from the zoo at every stage.

The decoder follows the MAResU-Net pattern of the Taylor-attention paper (Li et al. 2020, arXiv 2007.14902):
at each scale, from the deepest up, attention mixes the whole feature map, then the map is upsampled and
fused with the encoder's skip connection.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import timm
import torch
import torch.nn.functional as F
from timm.layers import ConvNormAct
from timm.models import FeatureListNet
from torch import Tensor, nn

from segattn.layers import from_grid, to_grid

from .blocks import AttentionSpec, Block, MixFFN, recompute_in_backward
from .encoder import Encoder
from .options import UNetOptions

UNET_ENCODERS = (
    "resnet18",
    "resnet34",
    "resnet50",
    "convnext_tiny",
)  # tested; any features_only timm CNN works


class TimmCNNEncoder(Encoder):
    """A timm CNN with ``features_only=True``; returns its levels at stride ≥ 4 (a ResNet's stride-2 stem
    level is left out), e.g. strides 4, 8, 16, 32."""

    def __init__(self, encoder: str = "resnet18") -> None:
        super().__init__()
        try:
            self.model = timm.create_model(encoder, features_only=True, pretrained=False)
        except RuntimeError as err:
            raise ValueError(
                f"unet: encoder={encoder!r} is not a timm CNN with features_only support ({err}); "
                f"try one of {', '.join(UNET_ENCODERS)}"
            ) from None
        info = self.model.feature_info
        self.levels = [i for i, reduction in enumerate(info.reduction()) if reduction >= 4]
        self.out_channels = [info.channels()[i] for i in self.levels]
        self.out_strides = [info.reduction()[i] for i in self.levels]
        self.stride = self.out_strides[-1]
        # timm flattens top-level Sequentials (stages.0 → stages_0); a child's layer is the level it feeds
        feature_modules = [name.replace(".", "_") for name in info.module_name()]
        self._child_layer: dict[str, int] = {}
        level = 0
        for child, _ in self.model.named_children():
            self._child_layer[child] = level
            level += child in feature_modules
        self.num_layers = len(feature_modules)

        self.grad_checkpointing = False

    def forward(self, x: Tensor) -> list[Tensor]:
        features = self.checkpointed_features(x) if self.grad_checkpointing else self.model(x)
        return [features[i] for i in self.levels]

    def checkpointed_features(self, x: Tensor) -> list[Tensor]:
        """timm's feature forward with each child but the first and the last (and in-place ones, e.g. a
        stem ReLU) recomputed in backward, as timm's own checkpointing does, but through
        ``recompute_contexts`` so that a band of a split image is recomputed as that band, and with the
        BatchNorm statistics updated by the forward only."""
        features, children = [], list(self.model.items())
        for i, (name, child) in enumerate(children):
            skip = i in (0, len(children) - 1) or getattr(child, "inplace", False) is True
            x = child(x) if skip else recompute_in_backward(True, child, x, keep_stats_of=child)
            if name in self.model.return_layers:
                features.append(x)
        return features

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        if not isinstance(self.model, FeatureListNet):  # another feature wrapper: timm's checkpointing
            self.model.set_grad_checkpointing(enable)
            return
        self.grad_checkpointing = enable

    def layer_id(self, name: str) -> int:
        return self._child_layer[name.split(".")[1]]

    def convert_state_dict(self, state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
        """A timm classification checkpoint → the features_only module: top-level Sequential children are
        renamed the way timm flattens them (``stem.0`` → ``stem_0``); the classifier is dropped."""
        own = self.state_dict().keys()
        out = {}
        for key, value in state_dict.items():
            for candidate in (f"model.{key}", "model." + key.replace(".", "_", 1), key):
                if candidate in own:
                    out[candidate] = value
                    break
        return out


def create_unet_encoder(options: UNetOptions | None = None, **overrides: Any) -> TimmCNNEncoder:
    """The UNet family's encoder from ``options`` (``UNetOptions``, defaults if None) with any field
    replaced by ``overrides``: any timm CNN name (resnet18/34/50, convnext_tiny, ...)."""
    return TimmCNNEncoder(replace(options or UNetOptions(), **overrides).encoder)


class UNetDecoder(nn.Module):
    """Deepest level → [attention block → 2× upsample → concat skip → two 3×3 conv-BN-ReLU] per level →
    attention block at the shallowest level → 1×1 classifier (logits at the shallowest stride).

    Widths halve per level from ``channels`` (at least 16); attention heads are 32 wide where they fit.
    """

    def __init__(
        self,
        in_channels: list[int],
        num_classes: int,
        attn_layer: AttentionSpec,
        channels: int = 256,
        dropout: float = 0.1,
        mlp_ratio: float = 2.0,
    ) -> None:
        super().__init__()
        self.num_classes = num_classes
        widths = [max(channels >> i, 16) for i in range(len(in_channels))]  # deepest first
        skips = in_channels[-2::-1]
        self.lateral = ConvNormAct(in_channels[-1], widths[0], 1)
        self.attn_blocks = nn.ModuleList(
            Block(w, attn_layer(w, w // 32 if w % 32 == 0 else 1), MixFFN(w, int(w * mlp_ratio)))
            for w in widths
        )
        self.fuse = nn.ModuleList(
            nn.Sequential(
                ConvNormAct(widths[i] + skip, widths[i + 1], 3), ConvNormAct(widths[i + 1], widths[i + 1], 3)
            )
            for i, skip in enumerate(skips)
        )
        self.dropout = nn.Dropout2d(dropout)
        self.classifier = nn.Conv2d(widths[-1], num_classes, 1)

    def forward(self, features: list[Tensor]) -> Tensor:
        x = self.lateral(features[-1])
        skips = features[-2::-1]
        for i, block in enumerate(self.attn_blocks):
            hw = (x.shape[2], x.shape[3])
            x = to_grid(block(from_grid(x), hw), hw)
            if i < len(skips):
                x = F.interpolate(x, size=skips[i].shape[-2:], mode="bilinear", align_corners=False)
                x = self.fuse[i](torch.cat([x, skips[i]], dim=1))
        return self.classifier(self.dropout(x))
