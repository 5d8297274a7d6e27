"""The Triton device functions every kernel of ``kernels`` calls: a feature map φ applied to a block of
q or k in registers and its backward, the strided block loads they read from, and the statistics some
maps take (column softmax over N, FLatten's focusing, PolaFormer's powers).

``KIND`` selects the map by the numbers ``kernels`` names: 0 IDENTITY, 1 ELU, 2 RELU, 3 L2, 4 SOFTMAX_D,
5 SOFTMAX_N, 6 FOCUS, 7 POLARITY, 8 POLARITY_SWAPPED. It is a compile-time constant, so each kernel is
compiled once per map with only that map's branch. Imported by ``kernels`` alone (which checks
TRITON_INTERPRET when it is first loaded).
"""

# ruff: noqa: N803  (upper case: Triton's convention for compile-time constants and shapes)

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def feature_map(x, rows_ok, cols_ok, KIND: tl.constexpr, scale, eps, power, row_a, row_b, col_a, col_b):
    """φ(x) of a [BLOCK_N, D] fp32 block, 0 outside the valid rows and channels; ``row_*`` ([BLOCK_N]) and
    ``col_*`` ([D]) carry the statistics of SOFTMAX_N (col_a max, col_b 1/Σexp), FOCUS (row_a max u,
    row_b ‖u‖/‖(u/max u)^p‖, col_a 1/softplus(scale)) and POLARITY (col_a the power p; x arrives with the
    sign of its half applied, ``load_input``)."""
    if KIND == 0:
        phi = x * scale
    elif KIND == 1:
        phi = tl.where(x > 0, x + 1.0, tl.exp(tl.minimum(x, 0.0)))
    elif KIND == 2:
        phi = tl.maximum(x, 0.0)
    elif KIND == 3:
        norm = tl.sqrt(tl.sum(x * x, axis=1))
        phi = x / tl.maximum(norm, eps)[:, None]
    elif KIND == 4:
        shifted = tl.where(cols_ok[None, :], x, float("-inf"))
        e = tl.exp(shifted - tl.max(shifted, axis=1)[:, None])
        phi = e / tl.sum(e, axis=1)[:, None]
    elif KIND == 5:
        phi = tl.exp(tl.minimum(x - col_a[None, :], 0.0)) * col_b[None, :]
    elif KIND == 6:
        u = (tl.maximum(x, 0.0) + 1e-6) * col_a[None, :]
        phi = tl.exp2(power * tl.log2(u / row_a[:, None])) * row_b[:, None]
    else:
        phi = tl.where(x > 0, tl.exp2(col_a[None, :] * tl.log2(tl.where(x > 0, x, 1.0))), 0.0)
    return tl.where(rows_ok[:, None] & cols_ok[None, :], phi, 0.0)


@triton.jit
def feature_map_backward(x, phi, grad, cols_ok, KIND: tl.constexpr, scale, eps, col_c):
    """∂L/∂x from ∂L/∂φ (``grad``) for every KIND but FOCUS and POLARITY (which return ``grad``); ``col_c`` is
    SOFTMAX_N's Σ_n φ·∂φ per channel."""
    if KIND == 0:
        out = grad * scale
    elif KIND == 1:
        out = grad * tl.minimum(phi, 1.0)  # φ'(x) = exp(min(x, 0)) = min(φ, 1)
    elif KIND == 2:
        out = tl.where(x > 0, grad, 0.0)
    elif KIND == 3:
        norm = tl.sqrt(tl.sum(x * x, axis=1))
        along = tl.where(norm > eps, tl.sum(phi * grad, axis=1), 0.0)
        out = (grad - phi * along[:, None]) / tl.maximum(norm, eps)[:, None]
    elif KIND == 4:
        out = phi * (grad - tl.sum(phi * grad, axis=1)[:, None])
    elif KIND == 5:
        out = phi * (grad - col_c[None, :])
    else:
        out = grad
    return tl.where(cols_ok[None, :], out, 0.0)


@triton.jit
def load_block(ptr, rows, rows_ok, cols, cols_ok, stride_n, stride_c):
    """A [BLOCK_N, D] block of a strided [N, d] matrix as fp32 (0 where masked)."""
    offsets = rows[:, None].to(tl.int64) * stride_n + cols[None, :] * stride_c
    return tl.load(ptr + offsets, mask=rows_ok[:, None] & cols_ok[None, :], other=0.0).to(tl.float32)


@triton.jit
def input_columns(cols, d, KIND: tl.constexpr):
    """The input column each feature column reads: itself, or for POLARITY c mod d_in (d = 2·d_in)."""
    if KIND >= 7:
        return tl.where(cols < d // 2, cols, cols - d // 2)
    return cols


@triton.jit
def load_input(ptr, rows, rows_ok, cols, cols_ok, stride_n, stride_c, d, KIND: tl.constexpr):
    """The [BLOCK_N, D] block ``feature_map`` maps: the strided [N, d] matrix's columns, or for POLARITY its
    d_in columns twice, negated in the half that holds φ(−x) (the second; the first for SWAPPED)."""
    x = load_block(ptr, rows, rows_ok, input_columns(cols, d, KIND), cols_ok, stride_n, stride_c)
    if KIND == 7:
        x = tl.where(cols[None, :] < d // 2, x, -x)
    if KIND == 8:
        x = tl.where(cols[None, :] < d // 2, -x, x)
    return x


@triton.jit
def load_map_stats(
    row_ptr, col_ptr, b, bh, h, N, d, rows, rows_ok, cols, cols_ok, col_bh, col_h, col_row, KIND: tl.constexpr
):
    """The statistics ``feature_map`` takes (zeros for the maps without): per token (row_ptr [B, N, 2],
    FOCUS) and per channel (col_ptr at bh·col_bh + h·col_h, rows ``col_row`` apart; SOFTMAX_N, FOCUS, and
    POLARITY's power per input channel). ``col_c``, SOFTMAX_N's Σ_n φ·∂φ, is left to the backward kernel."""
    row_a = tl.zeros(rows.shape, dtype=tl.float32)
    row_b = tl.zeros(rows.shape, dtype=tl.float32)
    col_a = tl.zeros(cols.shape, dtype=tl.float32)
    col_b = tl.zeros(cols.shape, dtype=tl.float32)
    col_c = tl.zeros(cols.shape, dtype=tl.float32)
    base = col_ptr + bh * col_bh + h * col_h + input_columns(cols, d, KIND)
    if KIND == 5:
        col_a = tl.load(base, mask=cols_ok, other=0.0)
        col_b = tl.load(base + col_row, mask=cols_ok, other=0.0)
    if KIND == 6:
        row_a = tl.load(row_ptr + (b * N + rows) * 2, mask=rows_ok, other=1.0)
        row_b = tl.load(row_ptr + (b * N + rows) * 2 + 1, mask=rows_ok, other=0.0)
        col_a = tl.load(base, mask=cols_ok, other=0.0)
    if KIND >= 7:
        col_a = tl.load(base, mask=cols_ok, other=1.0)
    return row_a, row_b, col_a, col_b, col_c
