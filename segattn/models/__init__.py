"""Segmentation models: ViT, PVTv2 and UNet families, each with any attention variant from the zoo."""

from .builder import HEADS, MODEL_FAMILIES, available_heads, available_models, build_model, model_options
from .encoder import Encoder
from .options import CommonOptions, PVTOptions, UNetHeadOptions, UNetOptions, ViTOptions
from .segmentor import Segmentor

__all__ = [
    "HEADS",
    "MODEL_FAMILIES",
    "CommonOptions",
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
