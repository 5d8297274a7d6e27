"""The ImageNet checkpoints of PVT v1 and of its linear-attention versions (FLatten-PVT, Agent-PVT,
PolaFormer-PVT) mapped onto segattn's ``pvt`` encoder in the PVT v1 layout (conf/model/pvt_v1.yaml).

The releases share PVT v1's names: ``patch_embed{s}`` (s = 1..4), ``pos_embed{s}`` (sized for 224² input),
``block{s}.{j}`` with ``attn.q`` + ``attn.kv`` (PolaFormer: ``attn.qg``, queries and gate), ``attn.sr`` /
``attn.norm`` where keys are reduced, ``mlp.fc1`` / ``mlp.fc2``, and an ImageNet classifier (``head``, a final
``norm`` and, in PVT v1 itself, a ``cls_token`` with its slot in ``pos_embed4``). Every key either maps to a
parameter of the encoder or is named in an error or a warning; only the classifier is dropped by design.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable

import torch
from torch import Tensor

from .pretrained import is_attention_extra

CLASSIFIER_KEYS = ("head.", "norm.", "cls_token")  # the ImageNet classifier: no part of a dense encoder
STAGE_RENAMES: list[tuple[re.Pattern[str], Callable[[re.Match[str]], str]]] = [
    (re.compile(r"patch_embed1\.(.+)"), lambda m: f"patch_embed.{m[1]}"),
    (re.compile(r"patch_embed(\d+)\.(.+)"), lambda m: f"stages.{int(m[1]) - 1}.downsample.{m[2]}"),
    (re.compile(r"pos_embed(\d+)"), lambda m: f"stages.{int(m[1]) - 1}.pos_embed"),
    (re.compile(r"block(\d+)\.(\d+)\.(.+)"), lambda m: f"stages.{int(m[1]) - 1}.blocks.{m[2]}.{m[3]}"),
]
# the attention each release trains with (a fingerprint parameter of its blocks → the release)
RELEASES = {
    ".attn.qg.": ("PolaFormer-PVT", "pola"),
    ".attn.an_bias": ("Agent-PVT", "agent"),
    ".attn.positional_encoding": ("FLatten-PVT", "flatten"),
}


def is_official_pvt(state_dict: dict[str, Tensor]) -> bool:
    """Whether ``state_dict`` has PVT v1's names: ``pos_embed1`` (PVTv2 releases have none of it)."""
    return "pos_embed1" in state_dict


def release_of(state_dict: dict[str, Tensor]) -> tuple[str, str]:
    """(release name, the segattn attention it needs) of an official PVT v1-layout checkpoint."""
    for fingerprint, release in RELEASES.items():
        if any(fingerprint in key for key in state_dict):
            return release
    return "PVT v1", "softmax"


def rename(key: str) -> str | None:
    """The segattn name of an official key, None when it has none. Attention parameters keep their official
    names (the zoo's flatten, agent and pola use them); ``convert_official_pvt`` merges q/kv/qg."""
    for pattern, replace in STAGE_RENAMES:
        match = pattern.fullmatch(key)
        if match:
            return replace(match)
    return None


def fit_shape(value: Tensor, target: Tensor | None) -> Tensor:
    """``value`` without the leading singleton dims the official code keeps (FLatten's [1, 1, C] ``scale``)
    when that gives the target's shape; unchanged otherwise (a real mismatch is reported by the loader)."""
    if target is not None and value.shape != target.shape and value.squeeze().shape == target.shape:
        return value.reshape(target.shape)
    return value


def convert_official_pvt(state_dict: dict[str, Tensor], own: dict[str, Tensor]) -> dict[str, Tensor]:
    """An official PVT v1-layout checkpoint renamed onto ``own`` (the pvt encoder's state_dict).

    ``attn.q`` + ``attn.kv`` become ``attn.qkv`` (rows [0:C] and [C:3C]); PolaFormer's ``attn.qg`` gives the
    q rows and, from its rows [C:2C], ``attn.gate``; the class token's slot is cut from the last
    ``pos_embed``. Keys the encoder has no place for and parameters the checkpoint lacks raise one
    ValueError naming them, except attention parameters beyond qkv/proj (another variant's extras: weights
    trained with one attention may seed another), which are named in a warning.
    """
    release, attention = release_of(state_dict)
    last_pos = max(int(k.removeprefix("pos_embed")) for k in state_dict if re.fullmatch(r"pos_embed\d+", k))
    out: dict[str, Tensor] = {}
    unused: dict[str, str | None] = {}  # official key → our name (None: it has none)
    for key, value in state_dict.items():
        if key.startswith(CLASSIFIER_KEYS):
            continue
        new = rename(key)
        queries = (key.replace(".attn.kv.", ".attn.q."), key.replace(".attn.kv.", ".attn.qg."))
        if ".attn.kv." in key and any(q in state_dict for q in queries):
            continue  # merged into qkv with its q
        if new is not None and ".attn.qg." in new and new.replace(".attn.qg.", ".attn.gate.") in own:
            query, gate = value.chunk(2, dim=0)  # PolaFormer: rows [0:C] queries, [C:2C] the gate
            out[new.replace(".attn.qg.", ".attn.gate.")] = gate
            key, new, value = (
                key.replace(".attn.qg.", ".attn.q."),
                new.replace(".attn.qg.", ".attn.q."),
                query,
            )
        if new is not None and ".attn.q." in new:
            kv_key = key.replace(".attn.q.", ".attn.kv.")
            if kv_key not in state_dict:
                unused[key] = None
                continue
            value = torch.cat([value, state_dict[kv_key]], dim=0)
            new = new.replace(".attn.q.", ".attn.qkv.")
        if key == f"pos_embed{last_pos}" and "cls_token" in state_dict:
            value = value[:, 1:]  # PVT v1's class token slot
        if new is None or new not in own:
            unused[key] = new
            continue
        out[new] = fit_shape(value, own[new])
    missing = [k for k in own if k not in out]
    hard_unused = [k for k, new in unused.items() if new is None or not is_attention_extra(new)]
    hard_missing = [k for k in missing if not is_attention_extra(k)]
    mismatched = [
        f"{k} {tuple(v.shape)} vs {tuple(own[k].shape)}" for k, v in out.items() if v.shape != own[k].shape
    ]
    hint = f"a {release} checkpoint loads into {layout_of(state_dict, attention)}"
    if hard_unused or hard_missing or mismatched:
        raise ValueError(
            f"{release} checkpoint does not fit this pvt encoder: checkpoint keys it has no place for "
            f"{listing(hard_unused)}, parameters the checkpoint lacks {listing(hard_missing)}, shape "
            f"mismatches {listing(mismatched)}; {hint}"
        )
    soft_unused = [k for k in unused if k not in hard_unused]
    soft_missing = [k for k in missing if k not in hard_missing]
    if soft_unused or soft_missing:
        warnings.warn(
            f"{release} checkpoint: attention parameters not loaded {listing(soft_unused)}, attention "
            f"parameters left at their initialisation {listing(soft_missing)}; {hint}",
            UserWarning,
            stacklevel=2,
        )
    return out


def layout_of(state_dict: dict[str, Tensor], attention: str) -> str:
    """The command-line settings an official checkpoint needs (its stage count, depths and agent counts
    read from its keys)."""
    stages = sorted({int(m[1]) for k in state_dict if (m := re.match(r"block(\d+)\.", k))})
    depths = [1 + max(int(k.split(".")[1]) for k in state_dict if k.startswith(f"block{s}.")) for s in stages]
    settings = f"model=pvt_v1 attention={attention} model.depths={depths}"
    if attention == "agent":
        counts = [state_dict[f"block{s}.0.attn.an_bias"].shape[1] for s in stages]
        options = ", ".join(f"{{agent_num: {n}}}" for n in counts)
        settings += f" 'model.stage_attention_options=[{options}]'"
    return (
        f"{settings} (model.patch_embed=plain, model.ffn=mlp, model.position_encoding=learned, "
        "model.stage_norm=false)"
    )


def listing(keys: list[str], shown: int = 8) -> str:
    """``[a, b, ...] (n)``: the first ``shown`` keys and the count."""
    more = ", ..." if len(keys) > shown else ""
    return f"[{', '.join(keys[:shown])}{more}] ({len(keys)})"
