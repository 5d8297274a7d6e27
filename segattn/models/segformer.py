"""SegFormer and MiT checkpoints in Hugging Face's layout (a folder with ``config.json`` and its weights, or
a hub id in the local cache) loaded into the ``pvt`` family: its PVTv2 encoder and ``mlp`` head are
SegFormer's.

transformers is never imported: ``config.json`` is read as JSON, the weights by ``read_weights_file``, and
every name is mapped here. The SegFormer sets the architecture (``segformer_architecture``): widths, depths,
heads, MLP ratios, spatial reductions, HF's LayerNorm eps and, for a segmentation model, the head width. Its
encoder loads into any attention (timm's rules: ``qkv``/``proj`` and everything outside attention load; a
variant's own parameters keep their initialisation); its decode head loads into the ``mlp`` head, the
classifier only when the class counts agree.
"""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import try_to_load_from_cache
from torch import Tensor

from ..record import RECORD_FILE
from .heads import MLPHead
from .pretrained import HF_FILENAMES, WEIGHT_SUFFIXES, load_fitting, read_weights_file
from .pvt import PVT_SIZES
from .segmentor import Segmentor

CONFIG_FILE = "config.json"
HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")
HF_LAYER_NORM_EPS = (
    1e-5  # transformers' SegFormer blocks use nn.LayerNorm's default, not config.layer_norm_eps
)
# HF's names (as on the hub, and as save_pretrained writes them) → segattn's, applied in order
RENAMES = (
    (r"^(segformer\.)?encoder\.patch_embeddings\.0\.", "encoder.patch_embed."),
    (r"^(segformer\.)?encoder\.patch_embeddings\.(\d+)\.", r"encoder.stages.\2.downsample."),
    (r"^(segformer\.)?encoder\.block\.(\d+)\.(\d+)\.", r"encoder.stages.\2.blocks.\3."),
    (r"^(segformer\.)?encoder\.layer_norm\.(\d+)\.", r"encoder.stages.\2.norm."),
    (r"\.layer_norm_(\d)\.", r".norm\1."),
    (r"(patch_embed|downsample)\.layer_norm\.", r"\1.norm."),
    (r"\.attention\.self\.(query|key|value|sr)\.", r".attn.\1."),
    (r"\.attention\.self\.layer_norm\.", ".attn.norm."),
    (r"\.attention\.output\.dense\.", ".attn.proj."),
    (r"\.mlp\.dense(\d)\.", r".mlp.fc\1."),
    (r"\.mlp\.dwconv\.dwconv\.", ".mlp.dwconv."),
    (r"^decode_head\.linear_c\.(\d+)\.proj\.", r"head.proj.\1."),
    (r"^decode_head\.linear_fuse\.", "head.fuse.conv."),
    (r"^decode_head\.batch_norm\.", "head.fuse.bn."),
    (r"^decode_head\.classifier\.", "head.classifier."),
)
# what segattn's pvt builds: SegFormer's overlapping patch embeddings on RGB, GELU in the Mix-FFN
FIXED = {"strides": [4, 2, 2, 2], "patch_sizes": [7, 3, 3, 3], "num_channels": 3, "hidden_act": "gelu"}
ARCHITECTURE = {  # pvt option → SegFormer config key
    "embed_dims": "hidden_sizes",
    "depths": "depths",
    "num_heads": "num_attention_heads",
    "mlp_ratios": "mlp_ratios",
    "sr_ratios": "sr_ratios",
}


@dataclass(frozen=True)
class SegFormer:
    """A SegFormer checkpoint: what named it (``source``), its ``folder`` and its ``config.json``."""

    source: str
    folder: Path
    config: dict[str, Any]

    @property
    def weights_file(self) -> Path:
        """``model.safetensors``, else ``pytorch_model.bin`` (read with ``weights_only=True``)."""
        files = [self.folder / name for name in HF_FILENAMES if (self.folder / name).is_file()]
        if not files:
            raise FileNotFoundError(
                f"model.pretrained={self.source}: the SegFormer folder {self.folder} holds config.json but "
                f"none of {', '.join(HF_FILENAMES)}"
            )
        return files[0]

    @property
    def is_segmentation(self) -> bool:
        """Whether it holds a decode head (SegformerForSemanticSegmentation) and not an encoder alone."""
        return "SegformerForSemanticSegmentation" in self.config.get("architectures", [])

    @property
    def classes(self) -> list[str]:
        """Its class names, by id (``id2label``)."""
        labels = self.config.get("id2label") or {}
        return [str(labels[key]) for key in sorted(labels, key=int)]

    def state_dict(self) -> dict[str, Tensor]:
        """Its weights under the Segmentor's names (``encoder.*``, ``head.*``); the ImageNet classifier of
        an MiT encoder dropped."""
        return convert_segformer(read_weights_file(self.weights_file))


def find_segformer(source: str | None) -> SegFormer | None:
    """The SegFormer ``source`` names: a folder, or a hub id (``nvidia/mit-b0``) in the local HF cache. None
    for a weights file or a timm name; a ValueError naming what a folder is when it is not a SegFormer."""
    if source is None or source.endswith(WEIGHT_SUFFIXES) or Path(source).is_file():
        return None
    if Path(source).is_dir():
        return read_segformer(source, Path(source))
    if not HUB_ID.fullmatch(source):
        return None
    cached = try_to_load_from_cache(source, CONFIG_FILE)
    if not isinstance(cached, str):
        raise FileNotFoundError(
            f"model.pretrained={source!r}: no such file or folder, nor a Hugging Face model of that id in "
            "the local cache, and segattn never downloads: on a machine with network run "
            f"`hf download {source}` and copy the cache (~/.cache/huggingface, or $HF_HOME) here, or give "
            "the downloaded folder"
        )
    return read_segformer(source, Path(cached).parent)


def read_segformer(source: str, folder: Path) -> SegFormer:
    """The SegFormer in ``folder``; a ValueError saying what the folder is when it is not one segattn's pvt
    builds."""
    if not (folder / CONFIG_FILE).is_file():
        raise ValueError(f"model.pretrained={source}: {describe_folder(folder)}; expected a SegFormer folder")
    try:
        config = json.loads((folder / CONFIG_FILE).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"model.pretrained={source}: config.json is not JSON ({error})") from None
    if not isinstance(config, dict) or config.get("model_type") != "segformer":
        kind = config.get("model_type") if isinstance(config, dict) else None
        architectures = ", ".join(config.get("architectures") or []) if isinstance(config, dict) else ""
        raise ValueError(
            f"model.pretrained={source}: a Hugging Face {kind or 'config.json without a model_type'} model "
            f"({architectures or 'no architectures listed'}), not a SegFormer; expected config.json with "
            "model_type 'segformer' (e.g. nvidia/mit-b0, nvidia/segformer-b0-finetuned-ade-512-512)"
        )
    problems = [f"no {key}" for key in [*FIXED, *ARCHITECTURE.values()] if key not in config] + [
        f"{key}={config[key]}" for key, value in FIXED.items() if key in config and config[key] != value
    ]
    if problems:
        raise ValueError(
            f"model.pretrained={source}: a SegFormer that segattn's pvt does not build (config.json: "
            f"{', '.join(problems)}); expected {FIXED}"
        )
    return SegFormer(source, folder, config)


def describe_folder(folder: Path) -> str:
    """What a folder without ``config.json`` is, in a few words."""
    for record in (RECORD_FILE, "model.yaml"):  # model.yaml: the record of exports before segattn.json
        if (folder / record).is_file():
            return f"a segattn export ({record}), not a SegFormer: open it with segattn.open_model"
    names = sorted(path.name for path in folder.iterdir())
    shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
    return f"a folder without config.json (it holds {shown or 'nothing'}), not a SegFormer"


def convert_segformer(weights: dict[str, Tensor]) -> dict[str, Tensor]:
    """HF SegFormer weights → the Segmentor's names: query, key and value concatenated into ``attn.qkv``,
    the head's linear projections as 1×1 convs, the fusion conv's input blocks from HF's deepest-first
    order into segattn's shallowest-first; the ImageNet ``classifier`` of an MiT encoder dropped."""
    renamed: dict[str, Tensor] = {}
    for key, value in weights.items():
        if key.startswith("classifier."):
            continue
        for pattern, replacement in RENAMES:
            key = re.sub(pattern, replacement, key)
        if key.startswith("head.proj.") and key.endswith(".weight"):
            value = value[..., None, None]
        if key == "head.fuse.conv.weight":
            levels = sum(name.startswith("decode_head.linear_c.") for name in weights) // 2
            value = torch.cat(value.chunk(levels, dim=1)[::-1], dim=1)
        renamed[key] = value
    for key in [k for k in renamed if ".attn.query." in k]:
        parts = [renamed.pop(key.replace(".query.", f".{part}.")) for part in ("query", "key", "value")]
        renamed[key.replace(".query.", ".qkv.")] = torch.cat(parts)
    return renamed


def segformer_architecture(segformer: SegFormer, config: dict[str, Any]) -> dict[str, Any]:
    """``config`` (``build_model``'s kwargs) with the SegFormer's architecture: the pvt lists, the matching
    ``size`` (b0–b5, when widths and depths are one), HF's LayerNorm eps and, for a segmentation model with
    the mlp head, ``head_channels``. A list ``config`` sets otherwise is a ValueError naming it."""
    if config["name"] != "pvt":
        raise ValueError(
            f"model.pretrained={segformer.source}: a SegFormer loads into model=pvt, not "
            f"model={config['name']}"
        )
    architecture = {option: list(segformer.config[key]) for option, key in ARCHITECTURE.items()}
    conflicts = [
        f"model.{option}={config[option]} (the SegFormer's: {value})"
        for option, value in architecture.items()
        if config.get(option) is not None and list(config[option]) != value
    ]
    if conflicts:
        raise ValueError(
            f"model.pretrained={segformer.source}: {', '.join(conflicts)}; leave them unset (null): the "
            "SegFormer sets them"
        )
    wanted = [architecture["embed_dims"], architecture["depths"]]
    sizes = [size for size, d in PVT_SIZES.items() if [list(d["embed_dims"]), list(d["depths"])] == wanted]
    architecture.update({"norm_eps": HF_LAYER_NORM_EPS, **({"size": sizes[0]} if sizes else {})})
    if segformer.is_segmentation and config.get("head") in (None, "mlp"):
        architecture["head_channels"] = int(segformer.config["decoder_hidden_size"])
    return {**config, **architecture}


def load_segformer(model: Segmentor, segformer: SegFormer) -> None:
    """Load the SegFormer's encoder into ``model.encoder`` and, when both are SegFormer's decode head, its
    head; a classifier for another number of classes keeps its initialisation, with a warning."""
    weights = segformer.state_dict()
    encoder = {k.removeprefix("encoder."): v for k, v in weights.items() if not k.startswith("head.")}
    load_fitting(model.encoder, encoder, segformer.source)
    head = {k.removeprefix("head."): v for k, v in weights.items() if k.startswith("head.")}
    if not head or not isinstance(model.head, MLPHead):
        return
    labels = len(head.get("classifier.bias", ()))
    if labels != model.num_classes:
        warnings.warn(
            f"model.pretrained={segformer.source}: the SegFormer predicts {labels} classes, this model "
            f"{model.num_classes}: its decode head loads but for the classifier, which starts from its "
            "initialisation",
            UserWarning,
            stacklevel=3,
        )
        head.update({k: v for k, v in model.head.state_dict().items() if k.startswith("classifier.")})
    load_fitting(model.head, head, segformer.source, "head")
