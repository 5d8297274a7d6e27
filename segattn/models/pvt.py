"""Hierarchical PVTv2 / SegFormer-MiT encoder: four stages at strides 4, 8, 16, 32, any attention per block.

Overlapping patch embeddings (7×7 stride 4, then 3×3 stride 2) and Mix-FFN give position information at
any resolution. Variants that accept ``sr_ratio`` reduce each stage's keys/values by its ``sr_ratios``
entry; by default (``sr_ratios=None``) the quadratic ones (softmax, sra) by PVTv2's (8, 4, 2, 1) and the
linear ones (agent, pola) not at all, as in the released Agent-PVT and PolaFormer-PVT; linear variants
without the option attend at full resolution.
Parameter names equal timm's ``PyramidVisionTransformerV2`` except that timm's ``attn.q`` and ``attn.kv``
are one ``attn.qkv`` here (rows [0:C] and [C:3C]); ``convert_state_dict`` concatenates them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from timm.models.pvt_v2 import checkpoint_filter_fn
from torch import Tensor, nn

from segattn.attention import attention_class
from segattn.layers import from_grid, to_grid

from .blocks import AttentionSpec, Block, LayerNorm, MixFFN, drop_path_rates, init_weights
from .encoder import Encoder
from .options import PVTOptions

_WIDE = (64, 128, 320, 512)
PVT_SIZES: dict[str, dict[str, tuple]] = {  # PVTv2 b0–b5 (Wang et al. 2021, arXiv 2106.13797)
    "b0": {"embed_dims": (32, 64, 160, 256), "depths": (2, 2, 2, 2), "mlp_ratios": (8, 8, 4, 4)},
    "b1": {"embed_dims": _WIDE, "depths": (2, 2, 2, 2), "mlp_ratios": (8, 8, 4, 4)},
    "b2": {"embed_dims": _WIDE, "depths": (3, 4, 6, 3), "mlp_ratios": (8, 8, 4, 4)},
    "b3": {"embed_dims": _WIDE, "depths": (3, 4, 18, 3), "mlp_ratios": (8, 8, 4, 4)},
    "b4": {"embed_dims": _WIDE, "depths": (3, 8, 27, 3), "mlp_ratios": (8, 8, 4, 4)},
    "b5": {"embed_dims": _WIDE, "depths": (3, 6, 40, 3), "mlp_ratios": (4, 4, 4, 4)},
}
PVT_NUM_HEADS = (1, 2, 5, 8)
PVT_SR_RATIOS = (8, 4, 2, 1)  # PVTv2's spatial reduction, the default of the quadratic variants


class OverlapPatchEmbed(nn.Module):
    """Strided conv whose windows overlap (kernel > stride), then LayerNorm over channels; NCHW in and out."""

    def __init__(self, in_chans: int, embed_dim: int, patch_size: int, stride: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_chans, embed_dim, patch_size, stride=stride, padding=patch_size // 2)
        self.norm = nn.LayerNorm(embed_dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(self.proj(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class PVTStage(nn.Module):
    """Optional 2× overlapping downsample, ``depth`` blocks on the token grid, LayerNorm; NCHW in and out."""

    def __init__(
        self,
        dim_in: int,
        dim: int,
        depth: int,
        num_heads: int,
        mlp_ratio: float,
        attn_layer: AttentionSpec,
        attn_extra: dict[str, int],
        drop_path: list[float],
        downsample: bool,
    ) -> None:
        super().__init__()
        self.downsample = OverlapPatchEmbed(dim_in, dim, patch_size=3, stride=2) if downsample else None
        self.blocks = nn.ModuleList(
            Block(
                dim, attn_layer(dim, num_heads, **attn_extra), MixFFN(dim, int(dim * mlp_ratio)), drop_path[i]
            )
            for i in range(depth)
        )
        self.norm = LayerNorm(dim)

    def forward(self, x: Tensor) -> Tensor:
        if self.downsample is not None:
            x = self.downsample(x)
        hw = (x.shape[2], x.shape[3])
        tokens = from_grid(x)  # [B, H·W, C]
        for block in self.blocks:
            tokens = block(tokens, hw)
        return to_grid(self.norm(tokens), hw)


class PyramidVisionTransformer(Encoder):
    """PVTv2 encoder returning every stage's output, [B, embed_dims[i], H / 2^(i+2), W / 2^(i+2)]."""

    def __init__(
        self,
        attn_layer: AttentionSpec,
        embed_dims: tuple[int, ...] = (32, 64, 160, 256),
        depths: tuple[int, ...] = (2, 2, 2, 2),
        num_heads: tuple[int, ...] = PVT_NUM_HEADS,
        mlp_ratios: tuple[float, ...] = (8, 8, 4, 4),
        sr_ratios: tuple[int, ...] | None = None,
        in_chans: int = 3,
        drop_path_rate: float = 0.0,
    ) -> None:
        super().__init__()
        if sr_ratios is None:  # PVTv2's reduction for quadratic variants; linear ones keep every key
            linear = not attention_class(attn_layer.name).quadratic
            sr_ratios = (1,) * len(embed_dims) if linear else PVT_SR_RATIOS
        per_stage = {
            "depths": depths,
            "num_heads": num_heads,
            "mlp_ratios": mlp_ratios,
            "sr_ratios": sr_ratios,
        }
        for key, values in per_stage.items():
            if len(values) != len(embed_dims):
                raise ValueError(
                    f"pvt: {key}={list(values)} has {len(values)} entries; expected one per stage "
                    f"({len(embed_dims)}, as in embed_dims={list(embed_dims)})"
                )
        if "sr_ratio" in attn_layer.options:
            raise ValueError(
                f"pvt: attention option sr_ratio={attn_layer.options['sr_ratio']} would apply to all stages; "
                "set the per-stage model.sr_ratios (e.g. [8, 4, 2, 1]) instead"
            )
        # spatial reduction for variants that take it (softmax, sra, agent, pola)
        reduce = attn_layer.accepts("sr_ratio")
        self.patch_embed = OverlapPatchEmbed(in_chans, embed_dims[0], patch_size=7, stride=4)
        rates = drop_path_rates(drop_path_rate, sum(depths))
        starts = [sum(depths[:i]) for i in range(len(depths))]
        self.stages = nn.ModuleList(
            PVTStage(
                embed_dims[max(i - 1, 0)],
                embed_dims[i],
                depths[i],
                num_heads[i],
                mlp_ratios[i],
                attn_layer,
                {"sr_ratio": sr_ratios[i]} if reduce else {},
                rates[starts[i] : starts[i] + depths[i]],
                downsample=i > 0,
            )
            for i in range(len(embed_dims))
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

    def layer_id(self, name: str) -> int:
        if name.startswith("patch_embed."):
            return 0
        _, stage, part, *rest = name.split(".")
        start = sum(self.depths[: int(stage)])
        if part == "blocks":
            return start + int(rest[0]) + 1
        if part == "downsample":
            return start + 1
        return start + self.depths[int(stage)]  # the stage's closing norm

    def convert_state_dict(self, state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
        """timm pvt_v2 (or original PVTv2 repo) weights → ours: ``attn.q`` + ``attn.kv`` → ``attn.qkv``
        (concatenated along the output rows), classifier dropped."""
        state_dict = checkpoint_filter_fn(state_dict, None)  # original-repo names → timm names
        out = {}
        for key, value in state_dict.items():
            if key.startswith("head.") or ".attn.kv." in key:
                continue
            if ".attn.q." in key:
                kv = state_dict[key.replace(".attn.q.", ".attn.kv.")]
                out[key.replace(".attn.q.", ".attn.qkv.")] = torch.cat([value, kv], dim=0)
            else:
                out[key] = value
        return out


def create_pvt(
    attn_layer: AttentionSpec, options: PVTOptions | None = None, **overrides: Any
) -> PyramidVisionTransformer:
    """A PVTv2 from ``options`` (``PVTOptions``, defaults if None) with any field replaced by ``overrides``:
    a named ``size`` (b0–b5) whose per-stage lists any list given overrides."""
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
        **dims,
    )
