"""Segmentation models: ViT, PVTv2 and UNet families, each with any attention variant from the zoo."""

from .builder import HEADS, MODEL_FAMILIES, available_heads, available_models, build_model
from .encoder import Encoder
from .segmentor import Segmentor

__all__ = [
    "HEADS",
    "MODEL_FAMILIES",
    "Encoder",
    "Segmentor",
    "available_heads",
    "available_models",
    "build_model",
]
