"""Launchers of the Triton kernels (``kernels.py``): block sizes, the split of N across programs, and the
two forward steps (context reduction, application) and two backward steps as tensor-in / tensor-out calls.

The reduction steps return the context (or its gradient) summed over the splits but not over the bands of
a split image: the autograd Functions (``functions.py``) sum it over the bands in between
(``parallel.token_reducer``), which is why context and application are separate calls.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
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
    # (tests/attention/test_triton_compile.py: ptxas's report)
    block = 16 if width > 64 else 32 if width == 64 else 64
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


def context(k: Tensor, v: Tensor, phi: MapSpec, factor: float) -> Tensor:
    """The extended context [[c·φ(k)ᵀv | c·φ(k)ᵀ1], [Σv | N]] of this process's tokens: [B·h, d + 1, dv + 1]
    fp32; k, v: [B, h, N, d] / [B, h, N, dv] views."""
    kernels = load_kernels()
    batch, heads, tokens, d = k.shape
    d *= phi.widening
    dv = v.shape[-1]
    blocks = Blocks.of(d, dv, k.dtype)
    num_blocks, splits, per_split = split_blocks(tokens, blocks.BLOCK_N, batch * heads, k.device)
    part = torch.empty(splits, batch * heads, d + 1, dv + 1, dtype=torch.float32, device=k.device)
    kernels.context_kernel[(batch * heads, splits)](
        k, v, part, *phi.args(k), *k.stride(), *v.stride(),
        heads, tokens, d, dv, per_split, num_blocks, *phi.col_strides,
        phi.scale, phi.eps, phi.power,
        KIND=phi.kind, num_warps=blocks.num_warps, **blocks.constants(),
    )  # fmt: skip
    out = part[0] if splits == 1 else part.sum(dim=0)
    if factor != 1.0:  # 1 for every variant but FLatten's and pola's means
        out[:, :d].mul_(factor)
    return out


def apply(
    q: Tensor,
    ctx: Tensor,
    out: Tensor,
    phi: MapSpec,
    eps: float,
    normalized: bool,
    bias: bool,
    addend: Tensor | None = None,
) -> Tensor | None:
    """Write (φ(q) S + β) / (φ(q) z + β₀ + eps) (+ ``addend``) into ``out`` ([B, h, N, dv], any strides) and
    return 1/den ([B·h, N] fp32), or φ(q) S and None without a normaliser; β, β₀ only with ``bias``."""
    kernels = load_kernels()
    batch, heads, tokens, d = q.shape
    d *= phi.widening
    dv = out.shape[-1]
    blocks = Blocks.of(d, dv, q.dtype)
    inv = torch.empty(batch * heads, tokens, dtype=torch.float32, device=q.device) if normalized else None
    extra = addend if addend is not None else out
    kernels.apply_kernel[(-(-tokens // blocks.BLOCK_N), batch * heads)](
        q, ctx, out, inv if inv is not None else ctx, extra, *phi.args(q),
        *q.stride(), *out.stride(), *extra.stride(),
        heads, tokens, d, dv, *phi.col_strides, phi.scale, phi.eps, phi.power, eps,
        KIND=phi.kind, NORMALIZED=normalized, HAS_BIAS=bias, HAS_ADDEND=addend is not None,
        num_warps=blocks.num_warps, **blocks.constants(),
    )  # fmt: skip
    return inv


def query_backward(
    q: Tensor,
    grad: Tensor,
    ctx: Tensor,
    inv: Tensor | None,
    grad_q: Tensor,
    phi: MapSpec,
    bias: bool,
) -> Tensor:
    """Write ∂q into ``grad_q`` (for FOCUS and POLARITY: ∂L/∂φ(q), fp32, [B, h, N, widening·d]) and return
    this process's context gradient [[∂S | ∂z], [∂β | ∂β₀]] ([B·h, d + 1, dv + 1] fp32), summed over its
    tokens."""
    kernels = load_kernels()
    batch, heads, tokens, d = q.shape
    d *= phi.widening
    dv = grad.shape[-1]
    blocks = Blocks.of(d, dv, q.dtype)
    num_blocks, splits, per_split = split_blocks(tokens, blocks.BLOCK_N, batch * heads, q.device)
    part = torch.empty(splits, batch * heads, d + 1, dv + 1, dtype=torch.float32, device=q.device)
    kernels.query_backward_kernel[(batch * heads, splits)](
        q, grad, ctx, inv if inv is not None else ctx, grad_q, part, *phi.args(q),
        *q.stride(), *grad.stride(), *grad_q.stride(),
        heads, tokens, d, dv, per_split, num_blocks, *phi.col_strides,
        phi.scale, phi.eps, phi.power,
        KIND=phi.kind, NORMALIZED=inv is not None, HAS_BIAS=bias,
        num_warps=blocks.num_warps, **blocks.constants(),
    )  # fmt: skip
    return part[0] if splits == 1 else part.sum(dim=0)


def keys_backward(
    k: Tensor,
    v: Tensor,
    grad_ctx: Tensor,
    grad_k: Tensor,
    grad_v: Tensor,
    phi: MapSpec,
    factor: float,
    bias: bool,
) -> None:
    """Write ∂k (for FOCUS and POLARITY: ∂L/∂φ(k), fp32) and ∂v from the context gradient summed over all
    tokens."""
    kernels = load_kernels()
    batch, heads, tokens, d = k.shape
    d *= phi.widening
    dv = v.shape[-1]
    blocks = Blocks.of(d, dv, k.dtype)
    kernels.keys_backward_kernel[(-(-tokens // blocks.BLOCK_N), batch * heads)](
        k, v, grad_ctx, grad_k, grad_v, *phi.args(k),
        *k.stride(), *v.stride(), *grad_k.stride(), *grad_v.stride(),
        heads, tokens, d, dv, *phi.col_strides, phi.scale, phi.eps, phi.power, factor,
        KIND=phi.kind, HAS_BIAS=bias, num_warps=blocks.num_warps, **blocks.constants(),
    )  # fmt: skip


def key_softmax_columns(k: Tensor) -> Tensor:
    """Each key channel's max and 1/Σexp over the tokens, [B·h, 3, d] fp32 (the third row is left for the
    backward's Σ_n φ·∂φ); the splits' online statistics are combined here."""
    kernels = load_kernels()
    batch, heads, tokens, d = k.shape
    blocks = Blocks.of(d, d, k.dtype)
    num_blocks, splits, per_split = split_blocks(tokens, blocks.BLOCK_N, batch * heads, k.device)
    part = torch.empty(splits, batch * heads, 2, d, dtype=torch.float32, device=k.device)
    kernels.key_softmax_stats_kernel[(batch * heads, splits)](
        k, part, *k.stride(), heads, tokens, d, per_split, num_blocks,
        D=blocks.D, BLOCK_N=blocks.BLOCK_N, num_warps=blocks.num_warps,
    )  # fmt: skip
    top = part[:, :, 0].amax(dim=0)
    total = (part[:, :, 1] * (part[:, :, 0] - top).exp()).sum(dim=0)
    return torch.stack([top, total.reciprocal(), torch.zeros_like(top)], dim=1)


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
