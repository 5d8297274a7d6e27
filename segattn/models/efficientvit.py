"""EfficientViT-B encoder (Cai et al. 2023, arXiv 2205.14756) on timm's building blocks, with any attention.

timm's ``efficientvit_b0..b3``: a stride-2 conv stem with depthwise-separable residual blocks, two MBConv
stages (strides 4, 8) and two stages of EfficientViT blocks (strides 16, 32). A block is a context module
(LiteMLA plus a residual) and then a local module (an MBConv plus a residual). Here the context module is
the zoo attention chosen by ``attention=`` on the stage's token grid, with ``width // head_dim`` heads;
``attention=litemla`` is timm's LiteMLA, so timm's weights load (``convert_state_dict``) and give timm's
features. The stem, the downsampling and local blocks and their parameter names are timm's own modules.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from timm.models.efficientvit_mit import MBConv, ResidualBlock, Stem, build_local_block
from torch import Tensor, nn

from segattn.attention import AttentionBase
from segattn.attention.litemla import LiteMultiScaleAttention
from segattn.layers import from_grid, to_grid

from .blocks import AttentionSpec, recompute_in_backward
from .encoder import Encoder
from .options import EfficientViTOptions

EFFICIENTVIT_SIZES: dict[str, dict[str, Any]] = {  # timm's efficientvit_b0..b3 (stem width first)
    "b0": {"widths": (8, 16, 32, 64, 128), "depths": (1, 2, 2, 2, 2), "head_dim": 16},
    "b1": {"widths": (16, 32, 64, 128, 256), "depths": (1, 2, 3, 3, 4), "head_dim": 16},
    "b2": {"widths": (24, 48, 96, 192, 384), "depths": (1, 3, 4, 4, 6), "head_dim": 32},
    "b3": {"widths": (32, 64, 128, 256, 512), "depths": (1, 4, 6, 6, 9), "head_dim": 32},
}
NORM, ACT = nn.BatchNorm2d, nn.Hardswish  # timm's EfficientVit defaults
FIRST_ATTENTION_STAGE = 2  # stages 0-1 are MBConv only; stages 2-3 (stride 16, 32) hold the attention


class EfficientViTBlock(nn.Module):
    """x + attn(x) on the [B, H·W, C] token grid, then timm's local module (MBConv + residual); NCHW."""

    def __init__(self, dim: int, attn: AttentionBase, expand_ratio: float) -> None:
        super().__init__()
        self.attn = attn
        self.local_module = ResidualBlock(
            MBConv(
                dim,
                dim,
                expand_ratio=expand_ratio,
                use_bias=(True, True, False),
                norm_layer=(None, None, NORM),
                act_layer=(ACT, ACT, None),
            ),
            nn.Identity(),
        )

    def forward(self, x: Tensor) -> Tensor:
        hw = (x.shape[2], x.shape[3])
        x = x + to_grid(self.attn(from_grid(x), hw), hw)
        return self.local_module(x)


class EfficientViTStage(nn.Module):
    """A stride-2 local block, then ``depth`` EfficientViT blocks (``attn_layer`` given) or ``depth - 1``
    local residual blocks (timm's ``EfficientVitStage``, same parameter names)."""

    def __init__(
        self,
        in_chs: int,
        out_chs: int,
        depth: int,
        expand_ratio: float,
        head_dim: int,
        attn_layer: AttentionSpec | None,
    ) -> None:
        super().__init__()
        vit_stage = attn_layer is not None
        blocks: list[nn.Module] = [
            ResidualBlock(
                build_local_block(in_chs, out_chs, 2, expand_ratio, NORM, ACT, fewer_norm=vit_stage), None
            )
        ]
        if attn_layer is not None:
            blocks += [
                EfficientViTBlock(out_chs, attn_layer(out_chs, out_chs // head_dim), expand_ratio)
                for _ in range(depth)
            ]
        else:
            blocks += [
                ResidualBlock(build_local_block(out_chs, out_chs, 1, expand_ratio, NORM, ACT), nn.Identity())
                for _ in range(depth - 1)
            ]
        self.blocks = nn.Sequential(*blocks)


class EfficientViT(Encoder):
    """EfficientViT-B returning its four stages, [B, widths[i + 1], H / 2^(i+2), W / 2^(i+2)], i = 0..3.
    Built by ``create_efficientvit``; the options and their defaults are ``EfficientViTOptions``'."""

    def __init__(
        self,
        attn_layer: AttentionSpec,
        *,
        widths: tuple[int, ...],
        depths: tuple[int, ...],
        head_dim: int,
        expand_ratio: float,
        in_chans: int = 3,
    ) -> None:
        super().__init__()
        if len(widths) != 5 or len(depths) != 5:
            raise ValueError(
                f"efficientvit: widths={list(widths)}, depths={list(depths)}; expected 5 entries each "
                "(the stem, then 4 stages)"
            )
        if head_dim <= 0 or any(w % head_dim for w in widths[3:]):
            raise ValueError(
                f"efficientvit: head_dim={head_dim} does not divide the attention stages' widths "
                f"{list(widths[3:])}; expected a positive divisor of both (e.g. 16 or 32)"
            )
        self.stem = Stem(in_chans, widths[0], depths[0], NORM, ACT)
        self.stages = nn.ModuleList(
            EfficientViTStage(
                widths[i],
                widths[i + 1],
                depths[i + 1],
                expand_ratio,
                head_dim,
                attn_layer if i >= FIRST_ATTENTION_STAGE else None,
            )
            for i in range(4)
        )
        self.grad_checkpointing = False
        self.out_channels = list(widths[1:])
        self.out_strides = [4, 8, 16, 32]
        self.stride = 32
        self.stage_sizes = [len(stage.blocks) for stage in self.stages]
        self.num_layers = sum(self.stage_sizes) + 1

    @property
    def attention_stride(self) -> int:
        """The stride of the first stage with attention."""
        return self.out_strides[FIRST_ATTENTION_STAGE]

    def forward(self, x: Tensor) -> list[Tensor]:
        x = self.stem(x)
        features = []
        for stage in self.stages:
            for block in stage.blocks:
                x = self.run_block(block, x)
            features.append(x)
        return features

    def run_block(self, block: nn.Module, x: Tensor) -> Tensor:
        return recompute_in_backward(self.grad_checkpointing, block, x, keep_stats_of=block)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute every block (stem excepted) in backward."""
        self.grad_checkpointing = enable

    def layer_id(self, name: str) -> int:
        """0 for the stem; block j of stage i: 1 + the blocks of the stages before + j."""
        if name.startswith("stem."):
            return 0
        _, stage, _, block, *_ = name.split(".")
        return 1 + sum(self.stage_sizes[: int(stage)]) + int(block)

    def convert_state_dict(self, state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
        """timm ``efficientvit_b*`` weights → ours: each block's ``context_module.main`` (timm's LiteMLA) to
        ``attn`` through ``LiteMultiScaleAttention.convert_timm_state_dict``; the classifier head dropped.
        With another attention the LiteMLA weights keep timm's names, and loading lists them as unexpected.
        """
        out: dict[str, Tensor] = {}
        blocks: dict[str, dict[str, Tensor]] = {}
        for key, value in state_dict.items():
            block, found, rest = key.partition(".context_module.main.")
            if found:
                blocks.setdefault(block, {})[rest] = value
            elif not key.startswith("head."):
                out[key] = value
        modules = dict(self.named_modules())
        for block, state in blocks.items():
            attn = modules.get(f"{block}.attn")
            if isinstance(attn, LiteMultiScaleAttention):
                state = attn.convert_timm_state_dict(state)
            out.update({f"{block}.attn.{key}": value for key, value in state.items()})
        return out


def create_efficientvit(
    attn_layer: AttentionSpec, options: EfficientViTOptions | None = None, **overrides: Any
) -> EfficientViT:
    """An EfficientViT-B from ``options`` (``EfficientViTOptions``, defaults if None) with any field replaced
    by ``overrides``: a named ``size`` (b0-b3) whose ``widths``, ``depths``, ``head_dim`` those given
    override."""
    o = replace(options or EfficientViTOptions(), **overrides)
    if o.size not in EFFICIENTVIT_SIZES:
        raise ValueError(f"efficientvit: size={o.size!r}; expected one of {sorted(EFFICIENTVIT_SIZES)}")
    dims = dict(EFFICIENTVIT_SIZES[o.size])
    overridden = {"widths": o.widths, "depths": o.depths, "head_dim": o.head_dim}
    dims.update({k: tuple(v) if isinstance(v, list) else v for k, v in overridden.items() if v is not None})
    return EfficientViT(attn_layer, expand_ratio=o.expand_ratio, **dims)
