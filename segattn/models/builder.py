"""``build_model``: a family name, an attention name and plain options → Segmentor.

Families and heads are looked up in small name registries, never from import paths found in a file. The
options each takes are the dataclasses of ``options.py``; ``parse_options`` checks a call against them.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from torch import nn

from segattn.attention import attention_class

from .blocks import AttentionSpec
from .efficientvit import create_efficientvit
from .encoder import Encoder
from .heads import EfficientViTHead, FCNHead, LinearHead, MLPHead, PUPHead
from .options import (
    CommonOptions,
    EfficientViTHeadOptions,
    EfficientViTOptions,
    NoHeadOptions,
    PVTOptions,
    UNetHeadOptions,
    UNetOptions,
    ViTOptions,
)
from .pretrained import load_encoder_weights
from .pvt import create_pvt
from .segformer import SegFormer, find_segformer, load_segformer, segformer_architecture
from .segmentor import Segmentor
from .unet import UNetDecoder, create_unet_encoder
from .vit import create_vit


@dataclass(frozen=True)
class Family:
    """A model family: its own options (a dataclass in ``options.py``), how it builds its encoder from them
    and the attention spec, the head it uses unless ``head`` says otherwise, and the common options its
    encoder reads among ``PART_OPTIONS``."""

    options: type
    create_encoder: Callable[[Any, AttentionSpec], Encoder]
    default_head: str
    uses: frozenset[str]


@dataclass(frozen=True)
class Head:
    """A head: its own options (a dataclass in ``options.py``), how it is built, and the common options
    it reads among ``PART_OPTIONS``."""

    options: type
    create: Callable[[Encoder, CommonOptions, Any, AttentionSpec], nn.Module]
    uses: frozenset[str]


# common options that only some parts read: a value other than the default that no part of the built model
# reads draws a warning (it is accepted: saved configs and the yaml files set them whatever the head)
PART_OPTIONS = ("attention", "attention_options", "head_channels", "dropout", "aux_weight")
ATTENTION = frozenset({"attention", "attention_options"})
AUX_HEAD_USES = frozenset({"head_channels", "dropout", "aux_weight"})

MODEL_FAMILIES: dict[str, Family] = {
    "vit": Family(ViTOptions, lambda o, attn: create_vit(attn, o), "linear", ATTENTION),
    "pvt": Family(PVTOptions, lambda o, attn: create_pvt(attn, o), "mlp", ATTENTION),
    "unet": Family(UNetOptions, lambda o, attn: create_unet_encoder(o), "unet", frozenset()),
    "efficientvit": Family(
        EfficientViTOptions, lambda o, attn: create_efficientvit(attn, o), "efficientvit", ATTENTION
    ),
}
HEADS: dict[str, Head] = {
    "linear": Head(
        NoHeadOptions,
        lambda enc, c, o, attn: LinearHead(enc.out_channels, c.num_classes, c.dropout),
        frozenset({"dropout"}),
    ),
    "pup": Head(
        NoHeadOptions,
        lambda enc, c, o, attn: PUPHead(
            enc.out_channels, enc.out_strides, c.num_classes, c.head_channels, c.dropout
        ),
        frozenset({"head_channels", "dropout"}),
    ),
    "mlp": Head(
        NoHeadOptions,
        lambda enc, c, o, attn: MLPHead(enc.out_channels, c.num_classes, c.head_channels, c.dropout),
        frozenset({"head_channels", "dropout"}),
    ),
    "unet": Head(
        UNetHeadOptions,
        lambda enc, c, o, attn: UNetDecoder(
            enc.out_channels, c.num_classes, attn, c.head_channels, c.dropout, o.head_mlp_ratio
        ),
        frozenset({"head_channels", "dropout"}) | ATTENTION,
    ),
    "efficientvit": Head(
        EfficientViTHeadOptions,
        lambda enc, c, o, attn: EfficientViTHead(
            enc.out_channels,
            c.num_classes,
            c.head_channels,
            o.head_depth,
            o.head_expand_ratio,
            o.head_final_expand,
            c.dropout,
        ),
        frozenset({"head_channels", "dropout"}),
    ),
}


def available_models() -> list[str]:
    """Names accepted by ``build_model`` (``model=<name>`` on the command line)."""
    return sorted(MODEL_FAMILIES)


def available_heads() -> list[str]:
    """Names accepted by the ``head`` option."""
    return sorted(HEADS)


def model_options(name: str, head: str | None = None) -> list[str]:
    """Options ``build_model(name, ...)`` takes with ``head`` (None: the family's default head): the
    family's, the head's, then the common ones, in declaration order."""
    family, head_name = family_and_head(name, head)
    schemas = (family.options, HEADS[head_name].options, CommonOptions)
    return [f.name for schema in schemas for f in fields(schema)]


@dataclass(frozen=True)
class ModelOptions:
    """A ``build_model`` call's options, split between the schemas of ``options.py``."""

    name: str
    head: str
    common: CommonOptions
    family: Any  # the family's options dataclass
    head_options: Any  # the head's options dataclass


def family_and_head(name: str, head: str | None) -> tuple[Family, str]:
    if name not in MODEL_FAMILIES:
        raise ValueError(f"unknown model {name!r}; expected one of: {', '.join(available_models())}")
    family = MODEL_FAMILIES[name]
    head_name = family.default_head if head is None else head
    if head_name not in HEADS:
        raise ValueError(
            f"model {name!r}: unknown head {head_name!r}; expected one of: {', '.join(available_heads())}"
        )
    return family, head_name


def parse_options(name: str, options: dict[str, Any]) -> ModelOptions:
    """Split ``options`` (everything ``build_model`` got but ``name``) between the common, family and head
    schemas. Refused, in one ValueError naming each option, the family, the head and the valid options: an
    option no schema of this family and head declares, except another head's option set to None or to
    that head's default (configs may list them whatever the head). The chosen head's own options given as
    None take their default."""
    family, head_name = family_and_head(name, options.get("head"))
    head = HEADS[head_name]
    common_names = {f.name for f in fields(CommonOptions)}
    family_names = {f.name for f in fields(family.options)}
    head_names = {f.name for f in fields(head.options)}
    other_heads = {  # option → default, of the heads not chosen
        f.name: f.default
        for other, spec in HEADS.items()
        if other != head_name
        for f in fields(spec.options)
        if f.name not in head_names
    }
    common: dict[str, Any] = {}
    own: dict[str, Any] = {}
    head_own: dict[str, Any] = {}
    refused: dict[str, str] = {}  # option → why, when it is some other family's or head's
    for key, value in options.items():
        if key in common_names:
            common[key] = value
        elif key in family_names:
            own[key] = value
        elif key in head_names:
            if value is not None:
                head_own[key] = value
        elif key in other_heads and (value is None or value == to_plain(other_heads[key])):
            continue
        else:
            refused[key] = owner_of(key)
    if refused:
        settings = ", ".join(f"model.{key}={options[key]!r}" for key in refused)
        names = ", ".join(f"{key!r}{why}" for key, why in refused.items())
        plural = "s" if len(refused) > 1 else ""
        raise ValueError(
            f"{settings}: model {name!r} with head {head_name!r} has no option{plural} {names}; "
            f"its options are: {', '.join(model_options(name, head_name))}"
        )
    return ModelOptions(
        name, head_name, CommonOptions(**common), family.options(**own), head.options(**head_own)
    )


def owner_of(option: str) -> str:
    """`` (an option of head 'unet')`` / `` (an option of model 'vit')`` or '' for an unknown option."""
    owners = [f"head {h!r}" for h, spec in HEADS.items() if option in {f.name for f in fields(spec.options)}]
    owners += [
        f"model {m!r}"
        for m, spec in MODEL_FAMILIES.items()
        if option in {f.name for f in fields(spec.options)}
    ]
    return f" (an option of {', '.join(owners)})" if owners else ""


def unused_options(parsed: ModelOptions) -> list[str]:
    """Common options set to a value other than their default that no part of the built model reads (e.g.
    ``head_channels`` with the linear head and no aux head, ``attention`` with unet and a non-unet head)."""
    uses = MODEL_FAMILIES[parsed.name].uses | HEADS[parsed.head].uses
    if parsed.common.aux_head:
        uses |= AUX_HEAD_USES
    defaults = CommonOptions(num_classes=parsed.common.num_classes)
    return [
        option
        for option in PART_OPTIONS
        if option not in uses and getattr(parsed.common, option) != getattr(defaults, option)
    ]


def build_model(
    name: str,
    num_classes: int,
    attention: str = "softmax",
    attention_options: dict[str, Any] | None = None,
    **family_options: Any,
) -> Segmentor:
    """Build model family ``name`` with attention ``attention`` everywhere it mixes tokens.

    ``family_options`` are the options declared in ``options.py``: ``CommonOptions`` (less the four above),
    the family's (``ViTOptions``, ``PVTOptions``, ``UNetOptions``, ``EfficientViTOptions``) and the head's
    (``UNetHeadOptions``, ``EfficientViTHeadOptions``);
    see ``parse_options`` for what is refused. The call's kwargs, as plain Python values, are kept in
    ``model.config`` so that ``build_model(**model.config)`` rebuilds the same architecture.
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
    segformer = find_segformer(config.get("pretrained"))
    if segformer is not None:
        config = segformer_architecture(segformer, config)
    model = assemble(parse_options(name, {k: v for k, v in config.items() if k != "name"}), segformer)
    model.config = config
    return model


def assemble(options: ModelOptions, segformer: SegFormer | None = None) -> Segmentor:
    """Encoder + head (+ optional auxiliary FCN head, loss weight ``aux_weight``) → Segmentor.

    ``pretrained`` is a local weights file or a timm model name found in the local HF cache, loaded into
    the encoder, or ``segformer``, the SegFormer it names, loaded into encoder and head. ``head_lr_mult``
    and ``layer_decay`` shape ``Segmentor.param_groups``.
    """
    c = options.common
    attention_class(c.attention)  # unknown attention names fail here, before any module is built
    for option in unused_options(options):
        key = {"attention": "attention", "attention_options": "attention.options"}.get(
            option, f"model.{option}"
        )
        warnings.warn(
            f"{key}={getattr(c, option)!r} has no effect: model {options.name!r} with head "
            f"{options.head!r}{'' if c.aux_head else ' and no aux head'} does not use it",
            UserWarning,
            stacklevel=3,
        )
    attn_layer = AttentionSpec(c.attention, dict(c.attention_options))
    encoder = MODEL_FAMILIES[options.name].create_encoder(options.family, attn_layer)
    head = HEADS[options.head].create(encoder, c, options.head_options, attn_layer)
    aux = FCNHead(encoder.out_channels, c.num_classes, c.head_channels, c.dropout) if c.aux_head else None
    model = Segmentor(encoder, head, aux, c.aux_weight, c.head_lr_mult, c.layer_decay)
    if segformer is not None:
        load_segformer(model, segformer)
    elif c.pretrained:
        load_encoder_weights(encoder, c.pretrained)
    if c.grad_checkpointing:
        model.set_grad_checkpointing(True)
    return model


def to_plain(value: Any) -> Any:
    """Mappings → dict, sequences → list (recursively), e.g. Hydra DictConfig/ListConfig → Python types."""
    if isinstance(value, Mapping):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [to_plain(v) for v in value]
    return value
