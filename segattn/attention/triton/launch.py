"""Launchers of the Triton kernels (``kernels.py``): block sizes, the split of N across programs, and the
forward and the backward as tensor-in / tensor-out calls, one launch each (two, with the caller's sum over
the bands of a split image between the phases: ``two_phases``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from . import load_kernels

# Under the interpreter, which runs programs one after another at a fixed cost per operation: fewer, larger
# blocks, and a few splits per reduction (so the combine of several splits is still exercised).
INTERPRETER_PROGRAMS = 8
INTERPRETER_BLOCK_N = 256


@dataclass(frozen=True)
class Tuning:
    """Launch sizes that replace the defaults of ``Blocks.of`` and ``target_programs`` inside ``tuned``
    (``bench op --kernels triton:BxWxP`` times them side by side): tokens per block, warps per program,
    reduction programs per multiprocessor. None keeps the default."""

    block_n: int | None = None
    num_warps: int | None = None
    programs_per_sm: int | None = None

    @staticmethod
    def parse(text: str) -> Tuning:
        """``"128x8x4"`` (block x warps x programs per SM); a part written ``_`` keeps its default."""
        parts = text.split("x")
        if len(parts) != 3 or not all(p == "_" or (p.isdigit() and int(p) > 0) for p in parts):
            raise ValueError(f"Triton tuning {text!r}: expected BLOCKxWARPSxPROGRAMS, e.g. 128x8x4, 128x_x_")
        block, warps, programs = (None if p == "_" else int(p) for p in parts)
        if block is not None and (block < 16 or block & (block - 1)):
            raise ValueError(f"Triton tuning {text!r}: the block {block} must be a power of two >= 16")
        if warps is not None and warps & (warps - 1):
            raise ValueError(f"Triton tuning {text!r}: the warps {warps} must be a power of two")
        return Tuning(block, warps, programs)


ACTIVE_TUNING = Tuning()


@contextlib.contextmanager
def tuned(tuning: Tuning) -> Iterator[None]:
    """Launch every kernel called inside with ``tuning``'s sizes (forward and backward alike)."""
    global ACTIVE_TUNING
    previous, ACTIVE_TUNING = ACTIVE_TUNING, tuning
    try:
        yield
    finally:
        ACTIVE_TUNING = previous


@dataclass(frozen=True)
class MapSpec:
    """A feature map for the kernels: ``kind`` (``kernels.IDENTITY`` ...), its scalars, and the statistics
    it reads: ``rows`` [B, N, 2] per token (FOCUS), ``cols`` per channel with strides (per head·batch,
    per head, between its rows) (SOFTMAX_N: [B·h, 3, d]; FOCUS: 1/softplus(scale), [C]; POLARITY: the
    power, [h, d]). ``widening``: features per input channel (POLARITY's 2)."""

    kind: int
    scale: float = 1.0
    eps: float = 0.0
    power: float = 1.0
    rows: Tensor | None = None
    cols: Tensor | None = None
    col_strides: tuple[int, int, int] = (0, 0, 0)
    widening: int = 1

    def args(self, like: Tensor) -> tuple[Tensor, Tensor]:
        """The kernels' (row_ptr, col_ptr) arguments: the statistics, or ``like`` where there are none."""
        return (self.rows if self.rows is not None else like, self.cols if self.cols is not None else like)


def padded(n: int) -> int:
    """A head dim padded to a power of two of at least 16 (``tl.dot``'s smallest operand)."""
    return max(16, 1 << (n - 1).bit_length())


@dataclass(frozen=True)
class Blocks:
    """Compile-time sizes of one call: padded head dims, tokens per block, warps, dot precision."""

    D: int
    DV: int
    BLOCK_N: int
    num_warps: int
    precision: str

    @staticmethod
    def of(d: int, dv: int, dtype: torch.dtype) -> Blocks:
        # fp32 inputs follow PyTorch's TF32 setting for matmuls; half inputs carry less than TF32's mantissa
        tf32 = dtype != torch.float32 or torch.backends.cuda.matmul.allow_tf32
        return planned_blocks(d, dv, tf32, ACTIVE_TUNING)

    def constants(self) -> dict:
        return {"D": self.D, "DV": self.DV, "BLOCK_N": self.BLOCK_N, "PRECISION": self.precision}


@functools.lru_cache(maxsize=256)
def planned_blocks(d: int, dv: int, tf32: bool, tuning: Tuning) -> Blocks:
    """``Blocks.of``, planned once per head dims, precision and tuning (every call of a layer asks again)."""
    D, DV = padded(d), padded(dv)
    width = max(D, DV)
    # the largest blocks whose kernels compile for sm_90 without spilling registers, heads of 64 included
    # (tests/attention/test_triton_compile.py: ptxas's report); exact fp32 dots need more than TF32's
    block = 16 if width > 64 or (width == 64 and not tf32) else 32 if width == 64 else 64
    block = INTERPRETER_BLOCK_N if load_kernels().INTERPRETED else block
    warps = 8 if width >= 64 else 4
    block, warps = tuning.block_n or block, tuning.num_warps or warps
    return Blocks(D, DV, block, warps, "tf32" if tf32 else "ieee")


@functools.cache
def multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def target_programs(device: torch.device) -> int:
    """Programs a reduction over N aims for: a few per multiprocessor (one wave fills the GPU)."""
    return planned_programs(device, ACTIVE_TUNING.programs_per_sm)


@functools.lru_cache(maxsize=64)
def planned_programs(device: torch.device, programs_per_sm: int | None) -> int:
    if device.type == "cuda" and not load_kernels().INTERPRETED:
        return (programs_per_sm or 4) * multiprocessors(device)
    return INTERPRETER_PROGRAMS


def split_blocks(tokens: int, block: int, heads_batch: int, device: torch.device) -> tuple[int, int, int]:
    """(blocks, splits, blocks per split) for a reduction over ``tokens`` on a (B·h, splits) grid."""
    blocks = -(-tokens // block)
    splits = max(1, min(blocks, -(-target_programs(device) // heads_batch)))
    per_split = -(-blocks // splits)
    return blocks, -(-blocks // per_split), per_split


def as_heads(x: Tensor, heads: int) -> tuple[tuple[int, int, int, int], tuple[int, int, int, int]]:
    """Shape and strides of ``x`` as [B, h, N, d]: a 4-d x's own, or those of a [B, N, C] x split into
    ``heads`` (the kernels read the heads through these strides: no view is made)."""
    if x.dim() == 4:
        return tuple(x.shape), x.stride()
    (batch, tokens, channels), (sb, sn, sc) = x.shape, x.stride()
    return (batch, heads, tokens, channels // heads), (sb, channels // heads * sc, sn, sc)


def map_args(query: MapSpec, key: MapSpec, like: Tensor) -> tuple[tuple, tuple[int, int, int]]:
    """The kernels' (q_row_ptr, k_row_ptr, col_ptr) and col strides for the maps φq, φk: both read the same
    per-channel statistics where both have some (FOCUS's scale, POLARITY's power), else the one that has."""
    cols = key if key.cols is not None else query
    return (query.args(like)[0], key.args(like)[0], cols.args(like)[1]), cols.col_strides


def two_phases(kernel, args: tuple, summary: Tensor, grid: tuple[int, int], reduce, **constants) -> None:
    """Launch a two-phase kernel over ``grid`` (reducing programs, mapping programs): once (``BOTH``), or
    with ``reduce`` (the sum over the bands of a split image) applied to ``summary`` between a REDUCE and a
    MAP launch."""
    kernels = load_kernels()
    reducers, mappers = grid
    if reduce is None:
        kernel[(reducers + mappers,)](*args, PHASES=kernels.BOTH, **constants)
        return
    kernel[(reducers,)](*args, PHASES=kernels.REDUCE, **constants)
    reduce(summary)
    kernel[(mappers,)](*args, PHASES=kernels.MAP, **constants)


def forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    maps: tuple[MapSpec, MapSpec],
    scalars: tuple[float, float],
    options: tuple[bool, bool],
    addend: Tensor | None = None,
    reduce: Callable[[Tensor], object] | None = None,
    heads: int = 0,
) -> tuple[Tensor, Tensor | None]:
    """Write (φq(q) S + β) / (φq(q) z + β₀ + eps) (+ ``addend``) into ``out`` ([B, h, N, dv], any strides)
    and return the extended context [[c·φk(k)ᵀv | c·φk(k)ᵀ1], [Σv | M]] ([B·h, d + 1, dv + 1] fp32) and
    1/den ([B·h, N] fp32); without a normaliser φq(q) S and None. q [B, h, N, d], k, v [B, h, M, ·] of any
    strides, or [B, N, C] tensors split into ``heads`` (``as_heads``), as are ``out`` and ``addend``;
    ``maps``: φq, φk; ``scalars``: c, eps; ``options``: (normalized, bias: β and β₀)."""
    (query, key), (factor, eps), (normalized, bias) = maps, scalars, options
    (batch, heads, tokens, d), (_, _, keys, _), (*_, dv) = (as_heads(x, heads)[0] for x in (q, k, v))
    d *= query.widening
    blocks = Blocks.of(d, dv, q.dtype)
    num_blocks, splits, per_split = split_blocks(keys, blocks.BLOCK_N, batch * heads, q.device)
    part = torch.empty(splits, batch * heads, d + 1, dv + 1, dtype=torch.float32, device=q.device)
    ctx = torch.empty(batch * heads, d + 1, dv + 1, dtype=torch.float32, device=q.device)
    inv = torch.empty(batch * heads, tokens, dtype=torch.float32, device=q.device) if normalized else None
    sync = torch.zeros(batch * heads + 1, dtype=torch.int32, device=q.device)
    extra = addend if addend is not None else out
    pointers, col_strides = map_args(query, key, q)
    args = (
        q, k, v, out, ctx, inv if inv is not None else ctx, part, sync, extra, *pointers,
        *(stride for x in (q, k, v, out, extra) for stride in as_heads(x, heads)[1]),
        batch * heads, heads, tokens, keys, d, dv, splits, per_split, num_blocks, *col_strides,
        query.scale, query.eps, key.scale, key.eps, key.power, factor, eps,
    )  # fmt: skip
    grid = (batch * heads * splits, batch * heads * -(-tokens // blocks.BLOCK_N))
    two_phases(
        load_kernels().forward_kernel, args, ctx, grid, reduce,
        Q_KIND=query.kind, K_KIND=key.kind, NORMALIZED=normalized, HAS_BIAS=bias,
        HAS_ADDEND=addend is not None, num_warps=blocks.num_warps, **blocks.constants(),
    )  # fmt: skip
    return ctx, inv


def backward(
    inputs: tuple[Tensor, Tensor, Tensor],
    grad: Tensor,
    saved: tuple[Tensor, Tensor | None],
    grads: tuple[Tensor, Tensor, Tensor],
    maps: tuple[MapSpec, MapSpec],
    factor: float,
    bias: bool,
    reduce: Callable[[Tensor], object] | None = None,
    heads: int = 0,
) -> None:
    """Write ∂q, ∂k, ∂v into ``grads`` (for FOCUS and POLARITY ∂q and ∂k are ∂L/∂φ, fp32, [B, h, ·,
    widening·d]) from the output gradient, the inputs q, k, v and what ``forward`` returned (context,
    1/den or None); the context gradient is summed over the queries in between (and by ``reduce``). The
    tensors as ``forward``'s, [B, N, C] ones split into ``heads``."""
    (q, k, v), (ctx, inv), (query, key) = inputs, saved, maps
    (batch, heads, tokens, d), (_, _, keys, _), (*_, dv) = (as_heads(x, heads)[0] for x in (q, k, v))
    d *= query.widening
    blocks = Blocks.of(d, dv, q.dtype)
    num_blocks, splits, per_split = split_blocks(tokens, blocks.BLOCK_N, batch * heads, q.device)
    part = torch.empty(splits + 1, batch * heads, d + 1, dv + 1, dtype=torch.float32, device=q.device)
    sync = torch.zeros(batch * heads + 1, dtype=torch.int32, device=q.device)
    grad_ctx = part[splits]
    pointers, col_strides = map_args(query, key, q)
    args = (
        q, k, v, grad, ctx, inv if inv is not None else ctx, *grads, grad_ctx, part, sync, *pointers,
        *(stride for x in (q, k, v, grad, *grads) for stride in as_heads(x, heads)[1]),
        batch * heads, heads, tokens, keys, d, dv, splits, per_split, num_blocks, *col_strides,
        query.scale, query.eps, key.scale, key.eps, key.power, factor,
    )  # fmt: skip
    grid = (batch * heads * splits, batch * heads * -(-keys // blocks.BLOCK_N))
    two_phases(
        load_kernels().backward_kernel, args, grad_ctx, grid, reduce,
        Q_KIND=query.kind, K_KIND=key.kind, NORMALIZED=inv is not None, HAS_BIAS=bias,
        num_warps=blocks.num_warps, **blocks.constants(),
    )  # fmt: skip


def key_softmax_columns(k: Tensor, heads: int = 0) -> Tensor:
    """Each key channel's max and 1/Σexp over the tokens, [B·h, 2, d] fp32; the splits' online statistics
    are combined here. k: [B, h, N, d], or [B, N, C] split into ``heads``."""
    kernels = load_kernels()
    (batch, heads, tokens, d), strides = as_heads(k, heads)
    blocks = Blocks.of(d, d, k.dtype)
    num_blocks, splits, per_split = split_blocks(tokens, blocks.BLOCK_N, batch * heads, k.device)
    part = torch.empty(splits, batch * heads, 2, d, dtype=torch.float32, device=k.device)
    kernels.key_softmax_stats_kernel[(batch * heads, splits)](
        k, part, *strides, heads, tokens, d, per_split, num_blocks,
        D=blocks.D, BLOCK_N=blocks.BLOCK_N, num_warps=blocks.num_warps,
    )  # fmt: skip
    top = part[:, :, 0].amax(dim=0)
    total = (part[:, :, 1] * (part[:, :, 0] - top).exp()).sum(dim=0)
    return torch.stack([top, total.reciprocal()], dim=1)


def focus_blocks(channels: int) -> tuple[int, int, int]:
    """(padded C, tokens per block, warps) of the focusing kernels, which hold all C channels of a token."""
    width = padded(channels)
    return width, max(1, min(64, 4096 // width)), 4 if width <= 256 else 8


def focus_stats(x: Tensor, inv_scale: Tensor, power: float) -> Tensor:
    """FLatten's per-token statistics of x [B, N, C] (any strides): [B, N, 2] fp32, (max u and
    ‖u‖/‖(u/max u)^p‖) with u = (relu(x) + 1e-6)·``inv_scale``."""
    kernels = load_kernels()
    batch, tokens, channels = x.shape
    width, block, warps = focus_blocks(channels)
    stats = torch.empty(batch, tokens, 2, dtype=torch.float32, device=x.device)
    kernels.focus_stats_kernel[(-(-tokens // block), batch)](
        x, inv_scale, stats, *x.stride(), tokens, channels, power, CP=width, BLOCK_N=block, num_warps=warps
    )
    return stats


def focus_backward(
    x: Tensor, grad: Tensor, inv_scale: Tensor, stats: Tensor, power: float, grad_x: Tensor
) -> Tensor:
    """Write ∂x ([B, N, C]) from ∂f (``grad``, [B, N, C] fp32) and return ∂(1/softplus(scale)), [C] fp32."""
    kernels = load_kernels()
    batch, tokens, channels = x.shape
    width, block, warps = focus_blocks(channels)
    num_blocks = -(-tokens // block)
    part = torch.empty(batch * num_blocks, channels, dtype=torch.float32, device=x.device)
    kernels.focus_backward_kernel[(num_blocks, batch)](
        x, grad, inv_scale, stats, grad_x, part, *x.stride(), *grad.stride(), *grad_x.stride(),
        tokens, channels, power, CP=width, BLOCK_N=block, num_warps=warps,
    )  # fmt: skip
    return part.sum(dim=0)
