"""Hierarchical PVTv2 / SegFormer-MiT encoder: four stages at strides 4, 8, 16, 32, any attention per block.

Overlapping patch embeddings (7×7 stride 4, then 3×3 stride 2) and Mix-FFN give position information at
any resolution. Quadratic variants that accept ``sr_ratio`` (softmax, sra) reduce each stage's keys/values
by its ``sr_ratios`` entry (None: PVTv2's (8, 4, 2, 1)); the other variants that accept it (flatten, agent,
pola) by ``linear_sr_ratios``, the official code's ``la_sr_ratios`` (None: not at all, as in the released
FLatten-, Agent- and PolaFormer-PVT); variants without the option attend at full resolution.
Parameter names equal timm's ``PyramidVisionTransformerV2`` except that timm's ``attn.q`` and ``attn.kv``
are one ``attn.qkv`` here (rows [0:C] and [C:3C]); ``convert_state_dict`` concatenates them.

The PVT v1 layout of those releases (conf/model/pvt_v1.yaml) is a set of options: ``patch_embed="plain"``
(kernel = stride), ``ffn="mlp"``, ``position_encoding="learned"`` (per-stage embeddings stored on the
``img_size`` grids and resampled bilinearly to any grid, and the variants' own position parameters sized
by the same grids) and ``stage_norm=False``; ``official_pvt`` maps those checkpoints onto it.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any

import torch
from timm.layers import trunc_normal_
from timm.models.pvt_v2 import checkpoint_filter_fn
from torch import Tensor, nn

from segattn.attention import attention_class
from segattn.layers import HW, LayerNorm, from_grid, matmul_operand, resample_grid_embedding, to_grid

from .blocks import (
    AttentionSpec,
    Block,
    Checkpointable,
    MixFFN,
    TokenMlp,
    drop_path_rates,
    init_weights,
    recompute_in_backward,
    run_blocks,
)
from .encoder import Encoder
from .official_pvt import convert_official_pvt, is_official_pvt
from .options import PVTOptions

_WIDE = (64, 128, 320, 512)
PVT_SIZES: dict[str, dict[str, tuple]] = {  # PVTv2 b0–b5 (Wang et al. 2021, arXiv 2106.13797)
    "b0": {"embed_dims": (32, 64, 160, 256), "depths": (2, 2, 2, 2), "mlp_ratios": (8, 8, 4, 4)},
    "b1": {"embed_dims": _WIDE, "depths": (2, 2, 2, 2), "mlp_ratios": (8, 8, 4, 4)},
    "b2": {"embed_dims": _WIDE, "depths": (3, 4, 6, 3), "mlp_ratios": (8, 8, 4, 4)},
    "b3": {"embed_dims": _WIDE, "depths": (3, 4, 18, 3), "mlp_ratios": (8, 8, 4, 4)},
    "b4": {"embed_dims": _WIDE, "depths": (3, 8, 27, 3), "mlp_ratios": (8, 8, 4, 4)},
    "b5": {"embed_dims": _WIDE, "depths": (3, 6, 40, 3), "mlp_ratios": (4, 4, 4, 4)},
    # PVT v1 (arXiv 2102.12122) as released with FLatten, Agent and PolaFormer attention
    "tiny": {"embed_dims": _WIDE, "depths": (2, 2, 2, 2), "mlp_ratios": (8, 8, 4, 4)},
    "small": {"embed_dims": _WIDE, "depths": (3, 4, 6, 3), "mlp_ratios": (8, 8, 4, 4)},
    "medium": {"embed_dims": _WIDE, "depths": (3, 4, 18, 3), "mlp_ratios": (8, 8, 4, 4)},
    "large": {"embed_dims": _WIDE, "depths": (3, 8, 27, 3), "mlp_ratios": (8, 8, 4, 4)},
}
PVT_NUM_HEADS = (1, 2, 5, 8)
PVT_SR_RATIOS = (8, 4, 2, 1)  # PVTv2's spatial reduction, the default of the quadratic variants
LAYOUT_CHOICES = {  # option → its values: PVTv2's (the default) first, PVT v1's second
    "patch_embed": ("overlap", "plain"),
    "ffn": ("mix", "mlp"),
    "position_encoding": ("none", "learned"),
}


class PatchEmbed(Checkpointable):
    """Strided conv, then LayerNorm over channels; NCHW in and out. Windows overlap when the kernel is larger
    than the stride (PVTv2, padding k // 2); kernel = stride cuts non-overlapping patches (PVT v1).

    Under ``grad_checkpointing`` (switched with the blocks) conv output and norm are recomputed in backward:
    the stem's is a full [B, C, H/4, W/4] map held only to be normalised."""

    def __init__(self, in_chans: int, embed_dim: int, patch_size: int, stride: int) -> None:
        super().__init__()
        padding = patch_size // 2 if patch_size > stride else 0
        self.proj = nn.Conv2d(in_chans, embed_dim, patch_size, stride=stride, padding=padding)
        self.norm = LayerNorm(embed_dim)

    def forward(self, x: Tensor) -> Tensor:
        # cast before the checkpoint, which keeps the cast image rather than casting it again in the recompute
        return recompute_in_backward(self.grad_checkpointing, self.embed, matmul_operand(x))

    def embed(self, x: Tensor) -> Tensor:
        return self.norm(self.proj(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class PVTStage(nn.Module):
    """Optional 2× downsample (overlapping 3×3, or plain 2×2 patches), an optional learned position embedding
    (``pos_embed`` stored on ``pos_grid`` and resampled bilinearly to the input's grid), ``depth`` blocks on
    the token grid (Mix-FFN or plain MLP), then LayerNorm unless ``stage_norm`` is False (in autocast's dtype:
    convs read it, ``LayerNorm.feeds_matmul``); NCHW in and out."""

    def __init__(
        self,
        dim_in: int,
        dim: int,
        depth: int,
        num_heads: int,
        mlp_ratio: float,
        attn_layer: AttentionSpec,
        drop_path: list[float],
        downsample: bool,
        patch_embed: str = "overlap",
        ffn: str = "mix",
        pos_grid: HW | None = None,
        stage_norm: bool = True,
        norm_eps: float = 1e-6,
    ) -> None:
        super().__init__()
        self.downsample = None
        if downsample:
            self.downsample = PatchEmbed(dim_in, dim, *((3, 2) if patch_embed == "overlap" else (2, 2)))
        self.pos_grid = pos_grid
        if pos_grid is not None:
            self.pos_embed = nn.Parameter(torch.zeros(1, pos_grid[0] * pos_grid[1], dim))
            trunc_normal_(self.pos_embed, std=0.02)
        hidden = int(dim * mlp_ratio)
        self.blocks = nn.ModuleList(
            Block(
                dim,
                attn_layer(dim, num_heads),
                MixFFN(dim, hidden) if ffn == "mix" else TokenMlp(dim, hidden),
                drop_path[i],
                norm_layer=partial(LayerNorm, eps=norm_eps),
            )
            for i in range(depth)
        )
        self.norm = LayerNorm(dim, eps=norm_eps, feeds_matmul=True) if stage_norm else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        if self.downsample is not None:
            x = self.downsample(x)
        hw = (x.shape[2], x.shape[3])
        tokens = from_grid(x)  # [B, H·W, C]
        if self.pos_grid is not None:
            tokens = tokens + self.pos_embed_for(hw)
        return to_grid(run_blocks(self.blocks, tokens, hw, self.norm), hw)

    def pos_embed_for(self, hw: HW) -> Tensor:
        """The position embedding resampled from ``pos_grid`` to ``hw`` (the stored one at ``pos_grid``)."""
        return resample_grid_embedding(self.pos_embed, self.pos_grid, hw)


class PyramidVisionTransformer(Encoder):
    """PVTv2 encoder (PVT v1 by the layout options) returning every stage's output,
    [B, embed_dims[i], H / 2^(i+2), W / 2^(i+2)]. Built by ``create_pvt``; the options and their defaults
    are ``PVTOptions``'.

    ``position_encoding="learned"`` stores a position embedding per stage on its ``img_size`` // stride
    grid, and sizes the variant's own position parameters by the same grid (reduced by the stage's ratio
    for keys): ``position_encoding="learned"`` and ``position_size`` for flatten and pola, ``bias_size`` for
    agent, over the values in attention.options. ``stage_attention_options`` (one dict per stage) sets
    per-stage attention options over attention.options, e.g. the released Agent-PVT's ``agent_num`` 9, 16,
    49, 49.
    """

    def __init__(
        self,
        attn_layer: AttentionSpec,
        *,
        embed_dims: tuple[int, ...],
        depths: tuple[int, ...],
        num_heads: tuple[int, ...],
        mlp_ratios: tuple[float, ...],
        sr_ratios: tuple[int, ...] | None,
        drop_path_rate: float,
        linear_sr_ratios: tuple[int, ...] | None,
        patch_embed: str,
        ffn: str,
        position_encoding: str,
        img_size: int,
        stage_norm: bool,
        stage_attention_options: list[dict[str, Any]] | None,
        norm_eps: float,
        in_chans: int = 3,
    ) -> None:
        super().__init__()
        stages = len(embed_dims)
        per_stage = {
            "depths": depths,
            "num_heads": num_heads,
            "mlp_ratios": mlp_ratios,
            "sr_ratios": sr_ratios or embed_dims,
            "linear_sr_ratios": linear_sr_ratios or embed_dims,
            "stage_attention_options": stage_attention_options or embed_dims,
        }
        for key, values in per_stage.items():
            if len(values) != stages:
                raise ValueError(
                    f"pvt: {key}={list(values)} has {len(values)} entries; expected one per stage "
                    f"({stages}, as in embed_dims={list(embed_dims)})"
                )
        layout = {"patch_embed": patch_embed, "ffn": ffn, "position_encoding": position_encoding}
        for key, value in layout.items():
            if value not in LAYOUT_CHOICES[key]:
                raise ValueError(f"pvt: {key}={value!r}; expected one of {list(LAYOUT_CHOICES[key])}")
        if "sr_ratio" in attn_layer.options:
            raise ValueError(
                f"pvt: attention option sr_ratio={attn_layer.options['sr_ratio']} would apply to all stages; "
                "set the per-stage model.sr_ratios (softmax, sra) or model.linear_sr_ratios (flatten, agent, "
                "pola), e.g. [8, 4, 2, 1], instead"
            )
        learned = position_encoding == "learned"
        grids = [img_size // (4 * 2**i) for i in range(stages)]  # each stage's grid at the pretraining size
        if learned and min(grids) < 1:
            raise ValueError(
                f"pvt: img_size={img_size} leaves no token in the last of {stages} stages; expected "
                f"img_size >= {4 * 2 ** (stages - 1)}"
            )
        ratios = stage_sr_ratios(attn_layer, stages, sr_ratios, linear_sr_ratios)
        specs = [  # per stage: attention.options, then what the stage sets over them
            replace(
                attn_layer,
                options={
                    **attn_layer.options,
                    **({"sr_ratio": ratios[i]} if ratios else {}),
                    **(stage_position_options(attn_layer, grids[i]) if learned else {}),
                    **(stage_attention_options[i] if stage_attention_options else {}),
                },
            )
            for i in range(stages)
        ]
        self.patch_embed = PatchEmbed(
            in_chans, embed_dims[0], *((7, 4) if patch_embed == "overlap" else (4, 4))
        )
        rates = drop_path_rates(drop_path_rate, sum(depths))
        starts = [sum(depths[:i]) for i in range(len(depths))]
        self.stages = nn.ModuleList(
            PVTStage(
                embed_dims[max(i - 1, 0)],
                embed_dims[i],
                depths[i],
                num_heads[i],
                mlp_ratios[i],
                specs[i],
                rates[starts[i] : starts[i] + depths[i]],
                downsample=i > 0,
                patch_embed=patch_embed,
                ffn=ffn,
                pos_grid=(grids[i], grids[i]) if learned else None,
                stage_norm=stage_norm,
                norm_eps=norm_eps,
            )
            for i in range(stages)
        )
        self.depths = list(depths)
        self.out_channels = list(embed_dims)
        self.out_strides = [4 * 2**i for i in range(len(embed_dims))]
        self.stride = self.out_strides[-1]
        self.num_layers = sum(depths) + 1
        init_weights(self)

    def forward(self, x: Tensor) -> list[Tensor]:
        x = self.patch_embed(x)
        features = []
        for stage in self.stages:
            x = stage(x)
            features.append(x)
        return features

    def no_weight_decay(self) -> set[str]:
        """Learned position embeddings (the stages' ``pos_embed``, flatten's and pola's key encodings)."""
        return {
            name for name, _ in self.named_parameters() if name.endswith(("pos_embed", "positional_encoding"))
        }

    def layer_id(self, name: str) -> int:
        if name.startswith("patch_embed."):
            return 0
        _, stage, part, *rest = name.split(".")
        start = sum(self.depths[: int(stage)])
        if part == "blocks":
            return start + int(rest[0]) + 1
        if part in ("downsample", "pos_embed"):  # the stage's embedding; stage 0's: the stem's layer
            return start + 1 if int(stage) else 0
        return start + self.depths[int(stage)]  # the stage's closing norm

    def convert_state_dict(self, state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
        """timm pvt_v2 (or original PVTv2 repo) weights → ours: ``attn.q`` + ``attn.kv`` → ``attn.qkv``
        (concatenated along the output rows), classifier dropped. The PVT v1-layout releases (PVT,
        FLatten-PVT, Agent-PVT, PolaFormer-PVT: ``pos_embed1``, ...) go through
        ``official_pvt.convert_official_pvt``, which names every key that does not fit."""
        if is_official_pvt(state_dict):
            return convert_official_pvt(state_dict, self.state_dict())
        state_dict = checkpoint_filter_fn(state_dict, None)  # original-repo names → timm names
        out = {}
        for key, value in state_dict.items():
            if key.startswith("head.") or ".attn.kv." in key:
                continue
            if ".attn.q." in key:
                kv_key = key.replace(".attn.q.", ".attn.kv.")
                if kv_key not in state_dict:
                    raise ValueError(
                        f"model.pretrained: the weights hold {key} but not {kv_key}, the keys and values of "
                        "the same PVTv2 attention; expected a whole PVTv2 state dict (timm pvt_v2_* or the "
                        "original repository's)"
                    )
                kv = state_dict[kv_key]
                out[key.replace(".attn.q.", ".attn.qkv.")] = torch.cat([value, kv], dim=0)
            else:
                out[key] = value
        return out


def stage_sr_ratios(
    attn_layer: AttentionSpec,
    stages: int,
    sr_ratios: tuple[int, ...] | None,
    linear_sr_ratios: tuple[int, ...] | None,
) -> tuple[int, ...] | None:
    """Per-stage ``sr_ratio`` of the variant, None if it takes none: ``sr_ratios`` (None: PVTv2's) for a
    quadratic variant (softmax, sra), ``linear_sr_ratios`` (None: no reduction) for any other (flatten,
    agent, pola; the official ``la_sr_ratios``)."""
    if not attn_layer.accepts("sr_ratio"):
        return None
    if attention_class(attn_layer.name).quadratic:
        return PVT_SR_RATIOS if sr_ratios is None else sr_ratios
    return (1,) * stages if linear_sr_ratios is None else linear_sr_ratios


def stage_position_options(attn_layer: AttentionSpec, grid: int) -> dict[str, Any]:
    """The variant's learned position parameters sized by the stage's pretraining grid side ``grid``, as the
    official PVT releases size them: flatten's and pola's key encoding, agent's biases."""
    options: dict[str, Any] = {}
    if attn_layer.accepts("position_encoding"):
        options["position_encoding"] = "learned"
    if attn_layer.accepts("position_size"):
        options["position_size"] = grid
    if attn_layer.accepts("bias_size"):
        options["bias_size"] = grid
    return options


def create_pvt(
    attn_layer: AttentionSpec, options: PVTOptions | None = None, **overrides: Any
) -> PyramidVisionTransformer:
    """A PVTv2 from ``options`` (``PVTOptions``, defaults if None) with any field replaced by ``overrides``:
    a named ``size`` (PVTv2's b0–b5, PVT v1's tiny–large) whose per-stage lists any list given overrides."""
    o = replace(options or PVTOptions(), **overrides)
    if o.size not in PVT_SIZES:
        raise ValueError(f"pvt: size={o.size!r}; expected one of {sorted(PVT_SIZES)}")
    overridden = {
        "embed_dims": o.embed_dims,
        "depths": o.depths,
        "num_heads": o.num_heads,
        "mlp_ratios": o.mlp_ratios,
    }
    dims = {**PVT_SIZES[o.size], "num_heads": PVT_NUM_HEADS}
    dims.update({k: tuple(v) for k, v in overridden.items() if v is not None})
    return PyramidVisionTransformer(
        attn_layer,
        sr_ratios=None if o.sr_ratios is None else tuple(o.sr_ratios),
        drop_path_rate=o.drop_path_rate,
        linear_sr_ratios=None if o.linear_sr_ratios is None else tuple(o.linear_sr_ratios),
        patch_embed=o.patch_embed,
        ffn=o.ffn,
        position_encoding=o.position_encoding,
        img_size=o.img_size,
        stage_norm=o.stage_norm,
        norm_eps=o.norm_eps,
        stage_attention_options=None
        if o.stage_attention_options is None
        else list(o.stage_attention_options),
        **dims,
    )
