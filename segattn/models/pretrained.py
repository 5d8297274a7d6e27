"""Pretrained encoder weights from a local file or a timm model name in the local Hugging Face cache.

Nothing here touches the network: a timm name is looked up in the cache only, and files are read with
``weights_only=True``. Weights are renamed by the encoder's ``convert_state_dict`` and then loaded
strictly, except for attention parameters beyond ``qkv``/``proj`` (e.g. FLatten's ``scale``, PVT's ``sr``),
which a checkpoint trained with another attention variant cannot provide.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import timm
import torch
from huggingface_hub import try_to_load_from_cache
from safetensors.torch import load_file
from torch import Tensor, nn

from .encoder import Encoder
from .pickles import not_a_weights_file, refused_pickle

WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".ckpt")
HF_FILENAMES = ("model.safetensors", "pytorch_model.bin")
HOW_TO_PROVIDE = (
    "Provide weights one of two ways: (1) on a machine with network run "
    "`python -c \"import timm; timm.create_model('{name}', pretrained=True)\"` "
    "and copy its Hugging Face cache (~/.cache/huggingface, or $HF_HOME) to this machine; "
    "(2) set model.pretrained to a local .safetensors/.pth state_dict file. "
    "Use model.pretrained=null to train from scratch."
)


def read_state_dict(source: str) -> dict[str, Tensor]:
    """Tensors from a local weights file, or from a timm model name (``pvt_v2_b0.in1k``) in the HF cache."""
    if source.endswith(WEIGHT_SUFFIXES) or os.sep in source or os.path.exists(source):
        return read_weights_file(Path(source))
    return read_timm_weights(source)


def read_weights_file(path: Path) -> dict[str, Tensor]:
    """A .safetensors file, or a torch pickle read with ``weights_only=True`` (``state_dict``/``model``
    wrappers and DDP's ``module.`` prefix are unwrapped)."""
    if not path.is_file():
        raise FileNotFoundError(
            f"pretrained weights file {str(path)!r} does not exist. "
            + HOW_TO_PROVIDE.format(name="<timm model name>")
        )
    if path.suffix == ".safetensors":
        try:
            return load_file(path)
        except Exception as error:  # safetensors raises its own SafetensorError for a bad header
            raise ValueError(f"model.pretrained={path}: unreadable .safetensors file: {error}") from None
    with path.open("rb") as handle:
        head = handle.read(4)
    expected = "a .safetensors file or a torch.save state_dict (.pth, .pt, .bin, .ckpt)"
    if (
        error := not_a_weights_file("model.pretrained", path, head, path.stat().st_size, expected)
    ) is not None:
        raise error
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise refused_pickle("model.pretrained", path, error) from None
    except (RuntimeError, EOFError, IndexError, KeyError, ValueError) as error:  # truncated or foreign
        text = " ".join(str(error).split())[:200] or type(error).__name__
        raise ValueError(
            f"model.pretrained={path}: unreadable weights file ({text}); expected {expected}"
        ) from None
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    return {k.removeprefix("module."): v for k, v in state.items() if isinstance(v, Tensor)}


def read_timm_weights(name: str) -> dict[str, Tensor]:
    """The state_dict of timm model ``name`` with pretrained weights, read from the local HF cache only."""
    try:
        cfg = timm.models.get_pretrained_cfg(name)
    except RuntimeError as err:  # a known architecture with an unknown tag
        raise ValueError(f"pretrained={name!r}: {err}. " + HOW_TO_PROVIDE.format(name=name)) from None
    if cfg is None or not cfg.hf_hub_id:
        raise ValueError(
            f"pretrained={name!r} is neither an existing weights file ({', '.join(WEIGHT_SUFFIXES)}) "
            "nor a timm model name with Hugging Face weights "
            "(e.g. pvt_v2_b0.in1k, vit_small_patch16_224.augreg_in21k_ft_in1k)"
        )
    filenames = (cfg.hf_hub_filename,) if cfg.hf_hub_filename else HF_FILENAMES
    for filename in filenames:
        path = try_to_load_from_cache(cfg.hf_hub_id, filename)
        if isinstance(path, str):
            return timm.create_model(
                name, pretrained=True, pretrained_cfg_overlay={"file": path}
            ).state_dict()
    raise FileNotFoundError(
        f"pretrained={name!r}: weights for {cfg.hf_hub_id} are not in the local Hugging Face cache and "
        "segattn never downloads. " + HOW_TO_PROVIDE.format(name=name)
    )


def is_attention_extra(key: str) -> bool:
    """Whether ``key`` is an attention parameter other than timm's qkv/proj (variant-specific)."""
    _, found, rest = key.partition(".attn.")
    return bool(found) and not rest.startswith(("qkv.", "proj."))


def load_encoder_weights(encoder: Encoder, source: str) -> None:
    """Load ``source`` (file path or timm name) into ``encoder``; a clear error lists what does not fit."""
    weights = read_state_dict(source)
    try:
        state_dict = encoder.convert_state_dict(weights)
    except ValueError as err:  # a converter that checks the fit itself (official_pvt) names what is wrong
        raise ValueError(f"pretrained={source!r}: {err}") from None
    load_fitting(encoder, state_dict, source)


def load_fitting(
    module: nn.Module, state_dict: dict[str, Tensor], source: str, part: str = "encoder"
) -> None:
    """Load ``state_dict`` (already under ``module``'s names) into ``module``, the model's ``part``; one
    ValueError lists what does not fit, attention parameters beyond qkv/proj aside."""
    own = module.state_dict()
    missing = [k for k in own if k not in state_dict and not is_attention_extra(k)]
    unexpected = [k for k in state_dict if k not in own and not is_attention_extra(k)]
    mismatched = [
        f"{k} {tuple(v.shape)} vs {tuple(own[k].shape)}"
        for k, v in state_dict.items()
        if k in own and v.shape != own[k].shape
    ]
    if missing or unexpected or mismatched:
        raise ValueError(
            f"pretrained={source!r} does not fit the {type(module).__name__} {part}: "
            f"missing {missing[:6]}{'...' if len(missing) > 6 else ''} ({len(missing)}), "
            f"unexpected {unexpected[:6]}{'...' if len(unexpected) > 6 else ''} ({len(unexpected)}), "
            f"shape mismatches {mismatched[:6]} ({len(mismatched)}). "
            "Check that model.size / model.encoder match the checkpoint's architecture."
        )
    module.load_state_dict({k: v for k, v in state_dict.items() if k in own}, strict=False)
