"""Segmentation models: ViT, PVTv2, UNet and EfficientViT families, each with any attention from the zoo."""

from .builder import HEADS, MODEL_FAMILIES, available_heads, available_models, build_model, model_options
from .encoder import Encoder
from .options import (
    CommonOptions,
    EfficientViTHeadOptions,
    EfficientViTOptions,
    PVTOptions,
    UNetHeadOptions,
    UNetOptions,
    ViTOptions,
)
from .segmentor import Segmentor

__all__ = [
    "HEADS",
    "MODEL_FAMILIES",
    "CommonOptions",
    "EfficientViTHeadOptions",
    "EfficientViTOptions",
    "Encoder",
    "PVTOptions",
    "Segmentor",
    "UNetHeadOptions",
    "UNetOptions",
    "ViTOptions",
    "available_heads",
    "available_models",
    "build_model",
    "model_options",
]
