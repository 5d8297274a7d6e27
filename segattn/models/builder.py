"""``build_model``: a family name, an attention name and plain options → Segmentor.

Families and heads are looked up in small name registries, never from import paths found in a file.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from segattn.attention import attention_class

from .blocks import AttentionSpec
from .encoder import Encoder
from .heads import FCNHead, LinearHead, MLPHead, PUPHead
from .pretrained import load_encoder_weights
from .pvt import create_pvt
from .segmentor import Segmentor
from .unet import UNetDecoder, create_unet_encoder
from .vit import create_vit


@dataclass(frozen=True)
class Family:
    """How a model family builds its encoder, and the head it uses unless ``head`` says otherwise."""

    create_encoder: Callable[..., Encoder]
    default_head: str


MODEL_FAMILIES: dict[str, Family] = {
    "vit": Family(create_vit, "linear"),
    "pvt": Family(create_pvt, "mlp"),
    "unet": Family(create_unet_encoder, "unet"),
}
HEADS: dict[str, Callable[..., nn.Module]] = {
    "linear": LinearHead,
    "pup": PUPHead,
    "mlp": MLPHead,
    "unet": UNetDecoder,
}


def available_models() -> list[str]:
    """Names accepted by ``build_model`` (``model=<name>`` on the command line)."""
    return sorted(MODEL_FAMILIES)


def available_heads() -> list[str]:
    """Names accepted by the ``head`` option."""
    return sorted(HEADS)


def build_model(
    name: str,
    num_classes: int,
    attention: str = "softmax",
    attention_options: dict[str, Any] | None = None,
    **family_options: Any,
) -> Segmentor:
    """Build model family ``name`` with attention ``attention`` everywhere it mixes tokens.

    ``family_options`` are the common options of ``assemble`` plus the family's encoder options (see
    ``create_vit``, ``create_pvt``, ``create_unet_encoder``). The call's kwargs, as plain Python values, are
    kept in ``model.config`` so that ``build_model(**model.config)`` rebuilds the same architecture.
    """
    config = to_plain(
        {
            "name": name,
            "num_classes": num_classes,
            "attention": attention,
            "attention_options": attention_options or {},
            **family_options,
        }
    )
    model = assemble(**config)
    model.config = config
    return model


def assemble(
    name: str,
    num_classes: int,
    attention: str,
    attention_options: dict[str, Any],
    head: str | None = None,
    head_channels: int = 256,
    dropout: float = 0.1,
    aux_head: bool = False,
    aux_weight: float = 0.4,
    pretrained: str | None = None,
    grad_checkpointing: bool = False,
    head_lr_mult: float = 1.0,
    layer_decay: float | None = None,
    **encoder_options: Any,
) -> Segmentor:
    """Encoder + head (+ optional auxiliary FCN head, loss weight ``aux_weight``) → Segmentor.

    ``pretrained`` is a local weights file or a timm model name found in the local HF cache, loaded into
    the encoder. ``head_lr_mult`` and ``layer_decay`` shape ``Segmentor.param_groups``.
    """
    if name not in MODEL_FAMILIES:
        raise ValueError(f"unknown model {name!r}; expected one of: {', '.join(available_models())}")
    family = MODEL_FAMILIES[name]
    attention_class(attention)  # unknown attention names fail here, before any module is built
    attn_layer = AttentionSpec(attention, dict(attention_options))
    encoder_params = set(inspect.signature(family.create_encoder).parameters)
    unknown = sorted(set(encoder_options) - (encoder_params - {"attn_layer"}))
    if unknown:
        valid = sorted(COMMON_OPTIONS | encoder_params - {"attn_layer"})
        raise ValueError(f"model {name!r} has no option(s) {unknown}; its options are: {', '.join(valid)}")
    if "attn_layer" in encoder_params:
        encoder_options["attn_layer"] = attn_layer
    encoder = family.create_encoder(**encoder_options)

    head_name = family.default_head if head is None else head
    if head_name not in HEADS:
        raise ValueError(
            f"model {name!r}: unknown head {head_name!r}; expected one of: {', '.join(available_heads())}"
        )
    head_inputs = {
        "in_channels": encoder.out_channels,
        "in_strides": encoder.out_strides,
        "num_classes": num_classes,
        "channels": head_channels,
        "dropout": dropout,
        "attn_layer": attn_layer,
    }
    head_params = inspect.signature(HEADS[head_name]).parameters
    head_module = HEADS[head_name](**{k: v for k, v in head_inputs.items() if k in head_params})
    aux_module = FCNHead(encoder.out_channels, num_classes, head_channels, dropout) if aux_head else None
    model = Segmentor(encoder, head_module, aux_module, aux_weight, head_lr_mult, layer_decay)
    if pretrained:
        load_encoder_weights(encoder, pretrained)
    if grad_checkpointing:
        model.set_grad_checkpointing(True)
    return model


# options every family takes (the keyword arguments of ``assemble`` after the four ``build_model`` ones)
COMMON_OPTIONS = set(list(inspect.signature(assemble).parameters)[4:-1])


def to_plain(value: Any) -> Any:
    """Mappings → dict, sequences → list (recursively), e.g. Hydra DictConfig/ListConfig → Python types."""
    if isinstance(value, Mapping):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [to_plain(v) for v in value]
    return value
