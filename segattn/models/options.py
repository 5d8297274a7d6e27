"""Every option ``build_model`` takes, declared once: common to all families, per family, per head.

``conf/model/<family>.yaml`` sets these keys (plus ``compile``, which train.py takes out first: it says
how to train, not what to build). ``build_model`` splits a call's options between the three schemas and
refuses an option that none of them declares for the chosen family and head (``builder.parse_options``).
A dataclass default is what an option left out means.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class CommonOptions:
    """Options of every family, whatever its head."""

    num_classes: int
    attention: str = "softmax"  # zoo variant of every attention block: encoders but unet, unet head
    attention_options: dict[str, Any] = field(default_factory=dict)
    head: str | None = None  # linear | pup | mlp | unet | efficientvit; None: the family's default head
    head_channels: int = 256  # hidden width of the pup / mlp / unet head and of the aux head (linear: none)
    dropout: float = 0.1  # before the classifier of the head and of the aux head
    aux_head: bool = False  # auxiliary FCN head on the second-deepest features
    aux_weight: float = 0.4  # its loss weight (Segmentor.aux_weight; 0 without aux head)
    pretrained: str | None = (
        None  # timm name or HF SegFormer (folder, cached hub id) or a .safetensors/.pth file
    )
    grad_checkpointing: bool = False
    head_lr_mult: float = 1.0  # learning-rate multiplier of head and aux head (Segmentor.param_groups)
    layer_decay: float | None = None  # layer-wise learning-rate decay of the encoder


# -- families: the encoder's options ------------------------------------------------------------------


@dataclass(frozen=True)
class ViTOptions:
    """Plain ViT (``vit.create_vit``); ``embed_dim``, ``depth``, ``num_heads`` override the ``size``'s."""

    size: str = "tiny"  # tiny | small | base | large (DeiT widths)
    embed_dim: int | None = None
    depth: int | None = None
    num_heads: int | None = None
    patch_size: int = 16
    img_size: int = 224  # grid the position embedding is stored at; resampled to any input
    mlp_ratio: float = 4.0
    drop_path_rate: float = 0.1  # stochastic depth of the deepest block, linearly less above
    init_values: float | None = None  # LayerScale init; None: off
    out_indices: list[int] | None = None  # blocks that feed the head; None: 4 evenly spaced


@dataclass(frozen=True)
class PVTOptions:
    """PVTv2 / SegFormer-MiT (``pvt.create_pvt``); a per-stage list given overrides the ``size``'s. The
    layout options' defaults are PVTv2's; conf/model/pvt_v1.yaml sets PVT v1's (the official FLatten-PVT,
    Agent-PVT and PolaFormer-PVT checkpoints load into it)."""

    size: str = "b0"  # b0 … b5 (PVTv2), tiny | small | medium | large (PVT v1)
    embed_dims: list[int] | None = None
    depths: list[int] | None = None
    num_heads: list[int] | None = None
    mlp_ratios: list[float] | None = None
    # spatial reduction of the quadratic variants taking sr_ratio (softmax, sra); None: (8, 4, 2, 1)
    sr_ratios: Sequence[int] | None = None
    drop_path_rate: float = 0.1  # stochastic depth of the deepest block, linearly less above
    # spatial reduction of the other variants taking sr_ratio (flatten, agent, pola); None: none
    linear_sr_ratios: Sequence[int] | None = None
    patch_embed: str = "overlap"  # overlap (PVTv2: 7×7/4, 3×3/2) | plain (PVT v1: 4×4/4, 2×2/2)
    ffn: str = "mix"  # mix (Mix-FFN, 3×3 depthwise conv) | mlp (PVT v1's plain MLP)
    # none | learned: per-stage position embeddings (and the variant's key encodings / biases) stored on the
    # img_size grids, resampled bilinearly to any input
    position_encoding: str = "none"
    img_size: int = 224  # pretraining input size that sizes the learned position encodings
    stage_norm: bool = True  # LayerNorm closing each stage (PVTv2); the PVT v1 releases have none
    norm_eps: float = 1e-6  # eps of the blocks' and stages' LayerNorms (timm's); HF SegFormer's: 1e-5
    # one dict of attention options per stage, over attention.options (Agent-PVT: agent_num 9, 16, 49, 49)
    stage_attention_options: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class UNetOptions:
    """UNet (``unet.create_unet_encoder``): a timm CNN with ``features_only``."""

    encoder: str = "resnet18"  # resnet18 | resnet34 | resnet50 | convnext_tiny | any features_only CNN


@dataclass(frozen=True)
class EfficientViTOptions:
    """EfficientViT-B (``efficientvit.create_efficientvit``); ``widths``, ``depths``, ``head_dim`` given
    override the ``size``'s."""

    size: str = "b0"  # b0 | b1 | b2 | b3 (timm's efficientvit_b*)
    widths: list[int] | None = None  # stem, then the 4 stages
    depths: list[int] | None = None  # stem blocks, then blocks per stage
    head_dim: int | None = None  # attention head width of stages 3-4: heads = width // head_dim
    expand_ratio: float = 4.0  # MBConv expansion


# -- heads: options only one head takes ----------------------------------------------------------------
# A head's options are accepted by every family. Given to another head, None or the default is accepted
# (a config may list them for every head) and anything else refused; None given to the head itself means
# the default. head_channels and dropout are common: every head but linear has a hidden width, and both
# also size the aux head.


@dataclass(frozen=True)
class NoHeadOptions:
    """A head with no option of its own (linear, pup, mlp)."""


@dataclass(frozen=True)
class UNetHeadOptions:
    """The UNet attention decoder (``unet.UNetDecoder``)."""

    head_mlp_ratio: float = 2.0  # MixFFN hidden width / width after each decoder attention block


@dataclass(frozen=True)
class EfficientViTHeadOptions:
    """The EfficientViT-Seg head (``heads.EfficientViTHead``)."""

    head_depth: int = 1  # residual MBConv blocks at the fused stride (EfficientViT-Seg: b0 1, b1-b3 3)
    head_expand_ratio: float = 4.0  # their expansion
    head_final_expand: float = 4.0  # width of the 1×1 conv before the classifier / head_channels
