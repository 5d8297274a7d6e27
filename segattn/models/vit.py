"""Plain Vision Transformer encoder whose blocks pass the patch grid to the attention (timm's Block can't).

Parameter names equal timm's ``VisionTransformer`` (``patch_embed.proj``, ``pos_embed``,
``blocks.i.attn.qkv``, ``norm``, ...), so ViT/DeiT checkpoints load after ``convert_state_dict`` drops
what a dense model has no use for: the classifier and the class/register tokens. Every token the
attention sees lies on the H×W patch grid (as in SAM and ViTDet), because the zoo's spatial operators
(FLatten's depthwise conv, PVT's spatial reduction) are defined on that grid only.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch
from timm.layers import PatchEmbed, resample_abs_pos_embed, trunc_normal_
from torch import Tensor, nn

from segattn.layers import HW, to_grid
from segattn.parallel import band_of_embedding

from .blocks import AttentionSpec, Block, LayerNorm, TokenMlp, drop_path_rates, init_weights
from .encoder import Encoder
from .options import ViTOptions

VIT_SIZES: dict[str, dict[str, int]] = {  # DeiT / ViT widths
    "tiny": {"embed_dim": 192, "depth": 12, "num_heads": 3},
    "small": {"embed_dim": 384, "depth": 12, "num_heads": 6},
    "base": {"embed_dim": 768, "depth": 12, "num_heads": 12},
    "large": {"embed_dim": 1024, "depth": 24, "num_heads": 16},
}
DROPPED_TIMM_KEYS = ("cls_token", "reg_token", "head.", "fc_norm.", "attn_pool.")


def evenly_spaced(depth: int, count: int = 4) -> list[int]:
    """``count`` block indices spread over ``depth`` blocks, ending at the last one (2, 5, 8, 11 for 12)."""
    return sorted({math.ceil(depth * (i + 1) / count) - 1 for i in range(count)})


class VisionTransformer(Encoder):
    """ViT with an absolute position embedding learned for ``img_size`` and resampled to any grid. Built by
    ``create_vit``; the options and their defaults are ``ViTOptions``'.

    ``forward`` returns the tokens after the blocks in ``out_indices`` (final ``norm`` applied, like timm's
    ``forward_intermediates(norm=True)``) as [B, C, H/p, W/p] maps, all at stride ``patch_size``.
    """

    def __init__(
        self,
        attn_layer: AttentionSpec,
        *,
        img_size: int,
        patch_size: int,
        embed_dim: int,
        depth: int,
        num_heads: int,
        mlp_ratio: float,
        drop_path_rate: float,
        init_values: float | None,
        out_indices: list[int] | None,
        in_chans: int = 3,
    ) -> None:
        super().__init__()
        self.patch_embed = PatchEmbed(
            img_size, patch_size, in_chans, embed_dim, output_fmt="NHWC", strict_img_size=False
        )
        self.grid_size: HW = tuple(self.patch_embed.grid_size)
        self.pos_embed = nn.Parameter(torch.zeros(1, self.patch_embed.num_patches, embed_dim))
        rates = drop_path_rates(drop_path_rate, depth)
        self.blocks = nn.ModuleList(
            Block(
                embed_dim,
                attn_layer(embed_dim, num_heads),
                TokenMlp(embed_dim, int(embed_dim * mlp_ratio)),
                drop_path=rates[i],
                init_values=init_values,
            )
            for i in range(depth)
        )
        self.norm = LayerNorm(embed_dim)
        self.out_indices = self._check_out_indices(
            evenly_spaced(depth) if out_indices is None else out_indices
        )
        self.out_channels = [embed_dim] * len(self.out_indices)
        self.out_strides = [patch_size] * len(self.out_indices)
        self.stride = patch_size
        self.num_layers = depth + 1
        trunc_normal_(self.pos_embed, std=0.02)
        init_weights(self)

    def _check_out_indices(self, out_indices: list[int]) -> list[int]:
        depth = len(self.blocks)
        bad = [i for i in out_indices if not -depth <= i < depth]
        if bad or not out_indices:
            raise ValueError(
                f"vit: out_indices={list(out_indices)}; expected block indices in [{-depth}, {depth})"
            )
        return sorted({i % depth for i in out_indices})

    def pos_embed_for(self, hw: HW) -> Tensor:
        """The position embedding bicubically resampled from the ``img_size`` grid to ``hw``; [1, H·W, C].
        On a band of a split image: the band's rows of the embedding resampled for the whole image."""
        return band_of_embedding(
            lambda grid: resample_abs_pos_embed(
                self.pos_embed, new_size=grid, old_size=self.grid_size, num_prefix_tokens=0
            ),
            hw,
            self.patch_embed.patch_size[0],
        )

    def forward_tokens(self, x: Tensor) -> tuple[list[Tensor], HW]:
        """Normalised tokens [B, H·W, C] after each block in ``out_indices``, and the grid (H, W)."""
        x = self.patch_embed(x)  # [B, H, W, C]
        hw = (x.shape[1], x.shape[2])
        x = x.flatten(1, 2) + self.pos_embed_for(hw)
        outs = []
        for i, block in enumerate(self.blocks[: self.out_indices[-1] + 1]):
            x = block(x, hw)
            if i in self.out_indices:
                outs.append(self.norm(x))
        return outs, hw

    def forward(self, x: Tensor) -> list[Tensor]:
        tokens, hw = self.forward_tokens(x)
        return [to_grid(t, hw) for t in tokens]

    def no_weight_decay(self) -> set[str]:
        return {"pos_embed"}

    def layer_id(self, name: str) -> int:
        if name.startswith(("patch_embed.", "pos_embed")):
            return 0
        if name.startswith("blocks."):
            return int(name.split(".")[1]) + 1
        return self.num_layers

    def convert_state_dict(self, state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
        """Drop timm's classifier and class/register tokens (and their position slots); resample the
        position embedding from the checkpoint's square grid to this model's ``img_size`` grid."""
        num_prefix = int("cls_token" in state_dict)
        if "reg_token" in state_dict:
            num_prefix += state_dict["reg_token"].shape[1]
        out = {k: v for k, v in state_dict.items() if not k.startswith(DROPPED_TIMM_KEYS)}
        pos = out.get("pos_embed")
        if pos is not None:
            side = math.isqrt(pos.shape[1] - num_prefix)
            if num_prefix and side * side == pos.shape[1] - num_prefix:  # prefix slots present (not DeiT-III)
                pos = pos[:, num_prefix:]
            side = math.isqrt(pos.shape[1])
            out["pos_embed"] = resample_abs_pos_embed(
                pos, new_size=self.grid_size, old_size=(side, side), num_prefix_tokens=0
            )
        return out


def create_vit(
    attn_layer: AttentionSpec, options: ViTOptions | None = None, **overrides: Any
) -> VisionTransformer:
    """A ViT from ``options`` (``ViTOptions``, defaults if None) with any field replaced by ``overrides``:
    a named ``size`` (tiny/small/base/large) whose ``embed_dim``, ``depth``, ``num_heads`` given override."""
    o = replace(options or ViTOptions(), **overrides)
    if o.size not in VIT_SIZES:
        raise ValueError(f"vit: size={o.size!r}; expected one of {sorted(VIT_SIZES)}")
    overridden = {"embed_dim": o.embed_dim, "depth": o.depth, "num_heads": o.num_heads}
    dims = {**VIT_SIZES[o.size], **{k: v for k, v in overridden.items() if v is not None}}
    return VisionTransformer(
        attn_layer,
        img_size=o.img_size,
        patch_size=o.patch_size,
        mlp_ratio=o.mlp_ratio,
        drop_path_rate=o.drop_path_rate,
        init_values=o.init_values,
        out_indices=o.out_indices,
        **dims,
    )
