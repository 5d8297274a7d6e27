"""Transformer pieces shared by the ViT and PVT encoders and the UNet decoder; the grid size travels as hw.

A block receives the attention module to use (built from the zoo by the caller), so every encoder runs
every attention variant. Parameter names follow timm (``norm1``, ``attn``, ``norm2``, ``mlp.fc1``, ...).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from timm.layers import DropPath, LayerScale, Mlp, trunc_normal_
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from segattn import layers
from segattn.attention import AttentionBase, attention_options, build_attention
from segattn.layers import HW, kernel_backend, mix_ffn
from segattn.layers.recompute import Reused, return_unread, unread_return
from segattn.parallel import recompute_contexts

LayerNorm = partial(layers.LayerNorm, eps=1e-6)  # the eps of timm's ViT and PVTv2 blocks


@dataclass(frozen=True)
class AttentionSpec:
    """An attention variant chosen by name; ``spec(dim, num_heads)`` builds one module per block."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)

    def __call__(self, dim: int, num_heads: int, **extra: Any) -> AttentionBase:
        return build_attention(self.name, dim, num_heads, **self.options, **extra)

    def accepts(self, option: str) -> bool:
        """Whether the variant's constructor takes ``option`` (e.g. PVT's ``sr_ratio``)."""
        return option in attention_options(self.name)


class TokenMlp(Mlp):
    """timm's per-token Mlp (``fc1``, ``act``, ``fc2``) with the block's ``(x, hw)`` call; hw is unused."""

    def forward(self, x: Tensor, hw: HW) -> Tensor:
        return super().forward(x)


class MixFFN(nn.Module):
    """SegFormer/PVTv2 Mix-FFN: fc1 → 3×3 depthwise conv on the token grid → GELU → fc2.

    The depthwise conv gives position information at any resolution. Names match timm's
    ``MlpWithDepthwiseConv`` so pvt_v2 checkpoints load unchanged. fc1's bias, conv and GELU are one
    Triton operator, or the whole of it Triton operators, where ``layers.choose_path`` says so
    (``layers.mix_ffn``; ``kernel_backend``: the settings when it was built).
    """

    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.dwconv = nn.Conv2d(hidden_dim, hidden_dim, 3, padding=1, groups=hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.kernel_backend = kernel_backend()

    def forward(self, x: Tensor, hw: HW) -> Tensor:
        read = not return_unread(self)
        return mix_ffn(x, hw, self.fc1, self.dwconv, self.fc2, self.kernel_backend, output_read=read)


@contextmanager
def running_stats_kept(module: nn.Module) -> Iterator[None]:
    """BatchNorm running statistics inside ``module`` are what they were on entry once the block exits: a
    checkpointed block recomputed in backward (batch statistics, as in its forward) updates them once."""
    norms = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    buffers = [
        b for m in norms for b in (m.running_mean, m.running_var, m.num_batches_tracked) if b is not None
    ]
    saved = [b.clone() for b in buffers]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in zip(buffers, saved, strict=True):
                buffer.copy_(value)


def recompute_in_backward(
    enabled: bool, function: Callable[..., Any], *args: Any, keep_stats_of: nn.Module | None = None
) -> Any:
    """``function(*args)``; with ``enabled`` (and autograd on) its activations are not stored but recomputed
    in backward (non-reentrant, so it works under DDP and with inputs that do not require grad; on the same
    band when the image is split across processes). The BatchNorm running statistics inside
    ``keep_stats_of`` are updated by the forward only, not again by the recompute, which takes what the
    forward computed through ``layers.recompute.reused`` (the head's batch statistics) from it."""
    if not (enabled and torch.is_grad_enabled()):
        return function(*args)
    if torch.compiler.is_compiling():  # the compiled graph recomputes pure operators only, no side effects
        return checkpoint(function, *args, use_reentrant=False)
    owner = function if isinstance(function, nn.Module) else getattr(function, "__self__", None)
    contexts = partial(segment_contexts, owner, keep_stats_of)
    return checkpoint(function, *args, use_reentrant=False, context_fn=contexts)


def segment_contexts(
    owner: object, keep_stats_of: nn.Module | None
) -> tuple[AbstractContextManager, AbstractContextManager]:
    """``checkpoint``'s context_fn: ``recompute_contexts``, with the forward's ``reused`` values given back in
    the recompute, ``owner``'s return unread there (``return_unread``) and ``keep_stats_of``'s running
    statistics kept."""
    forward, recompute = recompute_contexts()
    stats = nullcontext() if keep_stats_of is None else running_stats_kept(keep_stats_of)
    values = Reused()
    return all_of(forward, values.recording()), all_of(
        recompute, values.replaying(), unread_return(owner), stats
    )


@contextmanager
def all_of(*contexts: AbstractContextManager) -> Iterator[None]:
    """Enter ``contexts`` in turn."""
    with ExitStack() as stack:
        for context in contexts:
            stack.enter_context(context)
        yield


class Checkpointable(nn.Module):
    """A module that ``set_block_checkpointing`` switches: its forward runs through
    ``recompute_in_backward(self.grad_checkpointing, ...)``."""

    grad_checkpointing: bool = False


class Block(Checkpointable):
    """Pre-norm transformer block: x + attn(norm1(x), hw), then x + mlp(norm2(x), hw); the first add and
    norm2 are one operator on the opt-in ``residual`` form (``LayerNorm.after_residual``), and ``run_blocks``
    leaves the last add to the norm that follows.

    ``grad_checkpointing`` recomputes the block in backward (``recompute_in_backward``).
    ``init_values`` adds DeiT-III LayerScale (``ls1``/``ls2``).
    """

    def __init__(
        self,
        dim: int,
        attn: nn.Module,
        mlp: nn.Module,
        drop_path: float = 0.0,
        init_values: float | None = None,
        norm_layer: Callable[..., nn.Module] = LayerNorm,
    ) -> None:
        super().__init__()
        self.grad_checkpointing = False
        self.norm1 = norm_layer(dim, feeds_matmul=True)
        self.attn = attn
        self.ls1 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = norm_layer(dim, feeds_matmul=True)
        self.mlp = mlp
        self.ls2 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(
        self,
        x: Tensor,
        hw: HW,
        pending: Tensor | None = None,
        pending_drop: nn.Module | None = None,
        open_end: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """The block on [B, N, C] tokens. ``run_blocks`` leaves a block's last residual add to the norm after
        it: given ``pending``, the branch the block before left, norm1 adds it to x after ``pending_drop``
        (its drop path); with ``open_end`` the block returns (x after its first add, its second branch
        before drop_path2)."""
        args = (x, hw, pending, pending_drop, open_end)
        return recompute_in_backward(self.grad_checkpointing, self.residual_branches, *args)

    def residual_branches(
        self, x: Tensor, hw: HW, pending: Tensor | None, pending_drop: nn.Module | None, open_end: bool
    ) -> Tensor | tuple[Tensor, Tensor]:
        if pending is None:
            normed = self.norm1(x)
        else:
            x, normed = self.norm1(x, pending, pending_drop)
        x, normed = self.norm2(x, self.ls1(self.attn(normed, hw)), self.drop_path1)
        # the branch is read only by this block's return unless LayerScale keeps it for backward
        unread = return_unread(self) and isinstance(self.ls2, nn.Identity)
        with unread_return(self.mlp) if unread else nullcontext():
            branch = self.ls2(self.mlp(normed, hw))
        return (x, branch) if open_end else x + self.drop_path2(branch)


def run_blocks(blocks: Iterable[Block], x: Tensor, hw: HW, norm: nn.Module) -> Tensor:
    """``norm`` of ``blocks`` run in turn on [B, N, C] tokens. Where ``norm`` takes the opt-in ``residual``
    form (``LayerNorm.takes_residual``), each block's last residual add is left to the norm that follows it,
    the next block's norm1 and then ``norm``, which fuses it (``LayerNorm.after_residual``); a block under
    ``grad_checkpointing`` then keeps that branch with its input."""
    if not (isinstance(norm, layers.LayerNorm) and norm.takes_residual(x)):
        for block in blocks:
            x = block(x, hw)
        return norm(x)
    pending = drop = None
    for block in blocks:
        x, pending = block(x, hw, pending, drop, open_end=True)
        drop = block.drop_path2
    return norm(x) if pending is None else norm(x, pending, drop)[1]


def set_block_checkpointing(module: nn.Module, enable: bool) -> None:
    """Switch gradient checkpointing for every ``Block`` (and other ``Checkpointable``, such as PVT's patch
    embeddings) inside ``module``."""
    for m in module.modules():
        if isinstance(m, Checkpointable):
            m.grad_checkpointing = enable


def drop_path_rates(rate: float, depth: int) -> list[float]:
    """Stochastic-depth rates rising linearly from 0 to ``rate`` over ``depth`` blocks."""
    return [rate * i / (depth - 1) for i in range(depth)] if depth > 1 else [0.0] * depth


def init_weights(module: nn.Module) -> None:
    """timm/PVTv2 init, recursively: Linear trunc-normal(0.02) with zero bias, Conv2d normal(0, √(2/fan_out)).

    Inside an attention module only the timm-shared ``qkv`` and ``proj`` are touched; a variant's own
    parameters (Linformer's projections, FLatten's depthwise conv, ...) keep the variant's initialisation.
    """
    if isinstance(module, AttentionBase):
        init_layer(module.qkv)
        init_layer(module.proj)
        return
    init_layer(module)
    for child in module.children():
        init_weights(child)


def init_layer(module: nn.Module) -> None:
    """Initialise one Linear or Conv2d in place (other modules keep their defaults)."""
    if isinstance(module, nn.Linear):
        trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Conv2d):
        fan_out = module.kernel_size[0] * module.kernel_size[1] * module.out_channels // module.groups
        nn.init.normal_(module.weight, 0.0, math.sqrt(2.0 / fan_out))
        if module.bias is not None:
            nn.init.zeros_(module.bias)
