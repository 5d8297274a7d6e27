"""Triton kernels of the kernel-attention core: per head O = (φq(q) S + β) / (φq(q) z + β₀ + eps) with the
extended context [[S | z], [β | β₀]] = [[c·φk(k)ᵀv | c·φk(k)ᵀ1], [Σv | N]].

Every kernel reads q, k, v through their strides (any [B, h, N, d] view, fp32/bf16/fp16), computes the
feature maps in registers from them and accumulates in fp32; nothing of size N × d is written besides the
results. Head dims are padded to the power of two ``D`` (at least 16, what ``tl.dot`` needs) and masked.

- ``forward_kernel``: the context, then out = (φq S + β) / (φq z + β₀ + eps) (+ an addend) and 1/den per
  token for backward. Its first B·h·splits programs each sum φk(k)ᵀ[v | 1], Σv and its token count over
  a share of a head's keys into a [d + 1, dv + 1] partial; the last of a head's splits to finish adds
  them up (``publish``); the programs after them apply the summed context to blocks of queries.
- ``backward_kernel``: the same two phases backward: ∂q and the partial context gradient Ãᵀ[ĝ | −r] with
  Ã = [φq | 1] (its last row is ∂β), summed like the context, then ∂k and ∂v from that sum.

Both run their phases in one launch (``PHASES`` BOTH: a program of the second phase spins until its
head's sum is published; programs take their place by a ticket drawn when they start, so they only wait
on running ones), or as two launches (REDUCE, then MAP) where the caller must sum over the bands of a split
image in between. ``sync_ptr``: per head the count of published splits, then the ticket counter; zeroed
by the caller.
- ``key_softmax_stats_kernel``: per split, each channel's max and Σexp over the tokens (Efficient
  Attention's key softmax runs over N: the caller combines the splits into max and 1/Σexp).
- ``focus_stats_kernel`` / ``focus_backward_kernel``: FLatten's focusing map over all C channels of a
  token: per token max u and ‖u‖/‖(u/max u)^p‖ (so each head computes f_p in registers), and the
  focusing map's backward from ∂f with the partial gradient of 1/softplus(scale).

Grids over blocks of tokens put them on axis 0 (CUDA's other axes stop at 65,535 programs: 4M tokens in
blocks of 64; the two-phase kernels have a single axis), and offsets into q, k, v and the results are
64-bit (a tensor may pass 2³¹ elements).

Feature maps (``KIND``; the device functions that compute them and load blocks are ``feature_maps``):
IDENTITY c·x, ELU elu(x) + 1, RELU max(x, 0), L2 x / max(‖x‖, eps), SOFTMAX_D softmax over the head's
channels, SOFTMAX_N softmax over the tokens (column statistics from the pre-pass), FOCUS FLatten's f_p
(its backward leaves ∂f to ``focus_backward_kernel``, which needs all heads of a token), POLARITY
PolaFormer's [φ(x), φ(−x)] with φ(x) = relu(x)^p (p per channel), POLARITY_SWAPPED [φ(−x), φ(x)]: 2·d_in
features from d_in input channels (the kernels' ``d`` is the feature width, the input's column of feature
c is c mod d_in); their backward leaves ∂φ to the caller, which folds the two halves onto x.

TRITON_INTERPRET=1 runs the kernels on the CPU. Triton reads it whenever ``triton.jit`` wraps a function,
its own library's when triton is first imported (torch._dynamo imports it), so it must be set when the
process starts; set later, the two disagree and importing this module fails with a RuntimeError saying so.
``INTERPRETED`` records what was read.
"""

# ruff: noqa: N803  (upper case: Triton's convention for compile-time constants and shapes)

from __future__ import annotations

import triton
import triton.language as tl

from .feature_maps import feature_map, feature_map_backward, load_block, load_input, load_map_stats

INTERPRETED: bool = bool(triton.knobs.runtime.interpret)
if (type(tl.sum).__name__ == "InterpretedFunction") != INTERPRETED:
    raise RuntimeError(
        f"TRITON_INTERPRET={'1' if INTERPRETED else 'unset'} now, but triton was imported with the opposite "
        "setting; set it once, before the process starts"
    )

IDENTITY, ELU, RELU, L2, SOFTMAX_D, SOFTMAX_N, FOCUS, POLARITY, POLARITY_SWAPPED = range(9)
REDUCE, MAP, BOTH = 1, 2, 3  # the PHASES of a launch of forward_kernel or backward_kernel
# Integers that follow the token count: not specialised (N = 1, N % 16 = 0), so a new N reuses the binary
SPLIT_SIZES = ("BH", "N", "M", "splits", "blocks_per_split", "num_blocks")


@triton.jit
def place_of_program(sync_ptr, BH, reducers, PHASES: tl.constexpr):
    """This program's place in the grid's list of work: below ``reducers`` a share of a head's reduction,
    from there a block of its application. With both phases in one grid (BOTH) the place is a ticket drawn
    when the program starts, so a program waits only on programs already running (never on one the GPU
    has not scheduled yet)."""
    place = tl.program_id(0)
    if PHASES == 3:
        place = tl.atomic_add(sync_ptr + BH, 1)
    if PHASES == 2:
        place += reducers
    return place


@triton.jit
def load_context(ptr, d, dv, cols, cols_ok, vcols, vcols_ok):
    """S [D, DV], z [D], β [DV] and β₀ of one extended context [d + 1, dv + 1] at ``ptr``."""
    s = tl.load(
        ptr + cols[:, None] * (dv + 1) + vcols[None, :], mask=cols_ok[:, None] & vcols_ok[None, :], other=0.0
    )
    z = tl.load(ptr + cols * (dv + 1) + dv, mask=cols_ok, other=0.0)
    beta = tl.load(ptr + d * (dv + 1) + vcols, mask=vcols_ok, other=0.0)
    return s, z, beta, tl.load(ptr + d * (dv + 1) + dv)


@triton.jit
def store_context(ptr, d, dv, s, z, beta, beta0, cols, cols_ok, vcols, vcols_ok):
    tl.store(ptr + cols[:, None] * (dv + 1) + vcols[None, :], s, mask=cols_ok[:, None] & vcols_ok[None, :])
    tl.store(ptr + cols * (dv + 1) + dv, z, mask=cols_ok)
    tl.store(ptr + d * (dv + 1) + vcols, beta, mask=vcols_ok)
    tl.store(ptr + d * (dv + 1) + dv, beta0)


@triton.jit
def publish(
    part_ptr, sum_ptr, sync_ptr, bh, split, splits, BH, d, dv, factor,
    s, z, beta, beta0, cols, cols_ok, vcols, vcols_ok,
):  # fmt: skip
    """Store this program's share of head ``bh``'s extended sum; the last of its splits to finish adds the
    shares in split order (the same sum every run) into ``sum_ptr`` ([S | z] times ``factor``) and marks
    the head ready: its counter in ``sync_ptr`` reaches splits + 1."""
    size = (d + 1) * (dv + 1)
    store_context(
        part_ptr + (split * BH + bh) * size, d, dv, s, z, beta, beta0, cols, cols_ok, vcols, vcols_ok
    )
    tl.debug_barrier()  # every thread's stores before the release below
    if tl.atomic_add(sync_ptr + bh, 1) == splits - 1:
        tl.debug_barrier()
        total_s, total_z = tl.zeros_like(s), tl.zeros_like(z)
        total_beta, total_beta0 = tl.zeros_like(beta), tl.sum(tl.zeros_like(beta), axis=0)
        for i in range(splits):
            s_i, z_i, beta_i, beta0_i = load_context(
                part_ptr + (i * BH + bh) * size, d, dv, cols, cols_ok, vcols, vcols_ok
            )
            total_s, total_z, total_beta, total_beta0 = (
                total_s + s_i,
                total_z + z_i,
                total_beta + beta_i,
                total_beta0 + beta0_i,
            )
        store_context(
            sum_ptr + bh * size, d, dv, total_s * factor, total_z * factor, total_beta, total_beta0,
            cols, cols_ok, vcols, vcols_ok,
        )  # fmt: skip
        tl.debug_barrier()
        tl.atomic_add(sync_ptr + bh, 1)


@triton.jit
def wait_until_ready(sync_ptr, bh, splits, PHASES: tl.constexpr):
    """In a grid of both phases, spin until head ``bh``'s sum is complete (``publish``)."""
    if PHASES == 3:
        ready = tl.atomic_add(sync_ptr + bh, 0)
        while ready <= splits:
            ready = tl.atomic_add(sync_ptr + bh, 0)
        tl.debug_barrier()


@triton.jit(do_not_specialize=SPLIT_SIZES)
def forward_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, ctx_ptr, inv_ptr, part_ptr, sync_ptr, add_ptr,
    q_row_ptr, k_row_ptr, col_ptr,
    sqb, sqh, sqn, sqc, skb, skh, skn, skc, svb, svh, svn, svc, sob, soh, son, soc, sab, sah, san, sac,
    BH, H, N, M, d, dv, splits, blocks_per_split, num_blocks, col_bh, col_h, col_row,
    q_scale, q_eps, k_scale, k_eps, power, factor, eps,
    Q_KIND: tl.constexpr, K_KIND: tl.constexpr, NORMALIZED: tl.constexpr, HAS_BIAS: tl.constexpr,
    HAS_ADDEND: tl.constexpr, PHASES: tl.constexpr,
    D: tl.constexpr, DV: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    cols, vcols = tl.arange(0, D), tl.arange(0, DV)
    cols_ok, vcols_ok = cols < d, vcols < dv
    place = place_of_program(sync_ptr, BH, BH * splits, PHASES)
    if place < BH * splits:  # the context: this split's share of the M keys of head bh
        bh, split = place % BH, place // BH
        b, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
        k_base, v_base = k_ptr + b * skb + h * skh, v_ptr + b * svb + h * svh
        acc = tl.zeros([D, DV], dtype=tl.float32)
        acc_z = tl.zeros([D], dtype=tl.float32)
        acc_v = tl.zeros([DV], dtype=tl.float32)
        count = tl.zeros([BLOCK_N], dtype=tl.float32)  # tokens seen, per row of the block
        start = split * blocks_per_split
        for block in range(start, tl.minimum(start + blocks_per_split, num_blocks)):
            rows = block * BLOCK_N + tl.arange(0, BLOCK_N)
            rows_ok = rows < M
            row_a, row_b, col_a, col_b, _ = load_map_stats(
                k_row_ptr, col_ptr, b, bh, h, M, d,
                rows, rows_ok, cols, cols_ok, col_bh, col_h, col_row, K_KIND,
            )  # fmt: skip
            x = load_input(k_base, rows, rows_ok, cols, cols_ok, skn, skc, d, K_KIND)
            phi = feature_map(x, rows_ok, cols_ok, K_KIND, k_scale, k_eps, power, row_a, row_b, col_a, col_b)
            values = load_block(v_base, rows, rows_ok, vcols, vcols_ok, svn, svc)
            acc += tl.dot(tl.trans(phi), values, input_precision=PRECISION)
            acc_z += tl.sum(phi, axis=0)
            acc_v += tl.sum(values, axis=0)
            count += rows_ok.to(tl.float32)
        publish(
            part_ptr, ctx_ptr, sync_ptr, bh, split, splits, BH, d, dv, factor,
            acc, acc_z, acc_v, tl.sum(count, axis=0), cols, cols_ok, vcols, vcols_ok,
        )  # fmt: skip
    else:  # out = (φq S + β) / (φq z + β₀ + eps) (+ an addend) for a block of head bh's N queries
        bh, block = (place - BH * splits) % BH, (place - BH * splits) // BH
        b, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
        rows = block * BLOCK_N + tl.arange(0, BLOCK_N)
        rows_ok = rows < N
        row_a, row_b, col_a, col_b, _ = load_map_stats(
            q_row_ptr, col_ptr, b, bh, h, N, d, rows, rows_ok, cols, cols_ok, col_bh, col_h, col_row, Q_KIND
        )
        x = load_input(q_ptr + b * sqb + h * sqh, rows, rows_ok, cols, cols_ok, sqn, sqc, d, Q_KIND)
        phi = feature_map(x, rows_ok, cols_ok, Q_KIND, q_scale, q_eps, power, row_a, row_b, col_a, col_b)
        wait_until_ready(sync_ptr, bh, splits, PHASES)
        s, z, beta, beta0 = load_context(
            ctx_ptr + bh * (d + 1) * (dv + 1), d, dv, cols, cols_ok, vcols, vcols_ok
        )
        out = tl.dot(phi, s, input_precision=PRECISION)
        if NORMALIZED:
            den = tl.sum(phi * z[None, :], axis=1) + eps
            if HAS_BIAS:
                out += beta[None, :]
                den += beta0
            inv = 1.0 / den
            out = out * inv[:, None]
            tl.store(inv_ptr + bh * N + rows, inv, mask=rows_ok)
        mask = rows_ok[:, None] & vcols_ok[None, :]
        if HAS_ADDEND:
            out += load_block(add_ptr + b * sab + h * sah, rows, rows_ok, vcols, vcols_ok, san, sac)
        offsets = out_ptr + b * sob + h * soh + rows[:, None].to(tl.int64) * son + vcols[None, :] * soc
        tl.store(offsets, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=SPLIT_SIZES)
def backward_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, ctx_ptr, inv_ptr, dq_ptr, dk_ptr, dv_ptr, gctx_ptr, part_ptr, sync_ptr,
    q_row_ptr, k_row_ptr, col_ptr,
    sqb, sqh, sqn, sqc, skb, skh, skn, skc, svb, svh, svn, svc, sgb, sgh, sgn, sgc,
    sdqb, sdqh, sdqn, sdqc, sdkb, sdkh, sdkn, sdkc, sdvb, sdvh, sdvn, sdvc,
    BH, H, N, M, d, dv, splits, blocks_per_split, num_blocks, col_bh, col_h, col_row,
    q_scale, q_eps, k_scale, k_eps, power, factor,
    Q_KIND: tl.constexpr, K_KIND: tl.constexpr, NORMALIZED: tl.constexpr, HAS_BIAS: tl.constexpr,
    PHASES: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    cols, vcols = tl.arange(0, D), tl.arange(0, DV)
    cols_ok, vcols_ok = cols < d, vcols < dv
    size = (d + 1) * (dv + 1)
    place = place_of_program(sync_ptr, BH, BH * splits, PHASES)
    if place < BH * splits:
        # ∂q of this split's queries and its share of the context gradient: with ĝ = g/den, P = ĝ Sᵀ,
        # r = (Σ_c φ_c P_c + ĝ·β)/den: ∂φ = P − r zᵀ and ∂[S̃] += [φ | 1]ᵀ[ĝ | −r].
        bh, split = place % BH, place // BH
        b, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
        s, z, beta, _ = load_context(ctx_ptr + bh * size, d, dv, cols, cols_ok, vcols, vcols_ok)
        acc = tl.zeros([D, DV], dtype=tl.float32)
        acc_z = tl.zeros([D], dtype=tl.float32)
        acc_beta = tl.zeros([DV], dtype=tl.float32)
        acc_beta0 = tl.zeros([BLOCK_N], dtype=tl.float32)  # −Σ r, per row of the block
        q_base, g_base = q_ptr + b * sqb + h * sqh, g_ptr + b * sgb + h * sgh
        start = split * blocks_per_split
        for block in range(start, tl.minimum(start + blocks_per_split, num_blocks)):
            rows = block * BLOCK_N + tl.arange(0, BLOCK_N)
            rows_ok = rows < N
            row_a, row_b, col_a, col_b, col_c = load_map_stats(
                q_row_ptr, col_ptr, b, bh, h, N, d,
                rows, rows_ok, cols, cols_ok, col_bh, col_h, col_row, Q_KIND,
            )  # fmt: skip
            x = load_input(q_base, rows, rows_ok, cols, cols_ok, sqn, sqc, d, Q_KIND)
            phi = feature_map(x, rows_ok, cols_ok, Q_KIND, q_scale, q_eps, power, row_a, row_b, col_a, col_b)
            grad = load_block(g_base, rows, rows_ok, vcols, vcols_ok, sgn, sgc)
            if NORMALIZED:
                inv = tl.load(inv_ptr + bh * N + rows, mask=rows_ok, other=0.0)
                grad = grad * inv[:, None]
                p = tl.dot(grad, tl.trans(s), input_precision=PRECISION)
                r = tl.sum(phi * p, axis=1)
                if HAS_BIAS:
                    r += tl.sum(grad * beta[None, :], axis=1)
                r = r * inv
                dphi = p - r[:, None] * z[None, :]
                acc_z -= tl.sum(phi * r[:, None], axis=0)
                acc_beta += tl.sum(grad, axis=0)
                acc_beta0 -= r
            else:
                dphi = tl.dot(grad, tl.trans(s), input_precision=PRECISION)
            acc += tl.dot(tl.trans(phi), grad, input_precision=PRECISION)
            dx = feature_map_backward(x, phi, dphi, cols_ok, Q_KIND, q_scale, q_eps, col_c)
            offsets = dq_ptr + b * sdqb + h * sdqh + rows[:, None].to(tl.int64) * sdqn + cols[None, :] * sdqc
            tl.store(offsets, dx.to(dq_ptr.dtype.element_ty), mask=rows_ok[:, None] & cols_ok[None, :])
        publish(
            part_ptr, gctx_ptr, sync_ptr, bh, split, splits, BH, d, dv, 1.0,
            acc, acc_z, acc_beta, tl.sum(acc_beta0, axis=0), cols, cols_ok, vcols, vcols_ok,
        )  # fmt: skip
    else:
        # ∂k and ∂v of a block of keys from the whole context gradient: ∂φk = c(v ∂Sᵀ + 1 ∂zᵀ),
        # ∂v = c φk ∂S (+ 1 ∂β for Taylor's Σv); ∂z is 0 without a normaliser.
        bh, block = (place - BH * splits) % BH, (place - BH * splits) // BH
        b, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
        rows = block * BLOCK_N + tl.arange(0, BLOCK_N)
        rows_ok = rows < M
        row_a, row_b, col_a, col_b, col_c = load_map_stats(
            k_row_ptr, col_ptr, b, bh, h, M, d, rows, rows_ok, cols, cols_ok, col_bh, col_h, col_row, K_KIND
        )
        x = load_input(k_ptr + b * skb + h * skh, rows, rows_ok, cols, cols_ok, skn, skc, d, K_KIND)
        phi = feature_map(x, rows_ok, cols_ok, K_KIND, k_scale, k_eps, power, row_a, row_b, col_a, col_b)
        values = load_block(v_ptr + b * svb + h * svh, rows, rows_ok, vcols, vcols_ok, svn, svc)
        wait_until_ready(sync_ptr, bh, splits, PHASES)
        ds, dz, dbeta, _ = load_context(gctx_ptr + bh * size, d, dv, cols, cols_ok, vcols, vcols_ok)
        if K_KIND == 5:  # the key softmax's Σ_n φ·∂φ per channel is Σ_j ∂S·S
            col_c = tl.sum(
                ds * load_context(ctx_ptr + bh * size, d, dv, cols, cols_ok, vcols, vcols_ok)[0], axis=1
            )
        dphi = (tl.dot(values, tl.trans(ds), input_precision=PRECISION) + dz[None, :]) * factor
        dvalues = tl.dot(phi, ds, input_precision=PRECISION) * factor
        if HAS_BIAS:
            dvalues += dbeta[None, :]
        dx = feature_map_backward(x, phi, dphi, cols_ok, K_KIND, k_scale, k_eps, col_c)
        mask_k, mask_v = rows_ok[:, None] & cols_ok[None, :], rows_ok[:, None] & vcols_ok[None, :]
        dk_offsets = dk_ptr + b * sdkb + h * sdkh + rows[:, None].to(tl.int64) * sdkn + cols[None, :] * sdkc
        tl.store(dk_offsets, dx.to(dk_ptr.dtype.element_ty), mask=mask_k)
        dv_offsets = dv_ptr + b * sdvb + h * sdvh + rows[:, None].to(tl.int64) * sdvn + vcols[None, :] * sdvc
        tl.store(dv_offsets, dvalues.to(dv_ptr.dtype.element_ty), mask=mask_v)


@triton.jit(do_not_specialize=SPLIT_SIZES)
def key_softmax_stats_kernel(
    k_ptr, part_ptr, skb, skh, skn, skc, H, N, d, blocks_per_split, num_blocks,
    D: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    # Online max and Σexp per channel over this split's tokens; part: [splits, B·h, 2, d].
    bh, split = tl.program_id(0), tl.program_id(1)
    b, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
    cols = tl.arange(0, D)
    cols_ok = cols < d
    top = tl.full([D], float("-inf"), dtype=tl.float32)
    total = tl.zeros([D], dtype=tl.float32)
    start = split * blocks_per_split
    for block in range(start, tl.minimum(start + blocks_per_split, num_blocks)):
        rows = block * BLOCK_N + tl.arange(0, BLOCK_N)
        rows_ok = rows < N
        x = load_block(k_ptr + b * skb + h * skh, rows, rows_ok, cols, cols_ok, skn, skc)
        x = tl.where(rows_ok[:, None], x, float("-inf"))
        new_top = tl.maximum(top, tl.max(x, axis=0))
        total = total * tl.exp(top - new_top) + tl.sum(tl.exp(x - new_top[None, :]), axis=0)
        top = new_top
    base = part_ptr + (split * tl.num_programs(0) + bh) * 2 * d + cols
    tl.store(base, top, mask=cols_ok)
    tl.store(base + d, total, mask=cols_ok)


@triton.jit(do_not_specialize=("N",))
def focus_stats_kernel(
    x_ptr, inv_scale_ptr, stats_ptr, sxb, sxn, sxc, N, C, power,
    CP: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    # Per token of [B, N, C]: u = (relu(x) + 1e-6)/softplus(scale); stats = (max u, ‖u‖ / ‖(u/max u)^p‖).
    block, b = tl.program_id(0), tl.program_id(1).to(tl.int64)
    rows = block * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, CP)
    rows_ok, cols_ok = rows < N, cols < C
    x = load_block(x_ptr + b * sxb, rows, rows_ok, cols, cols_ok, sxn, sxc)
    inv_scale = tl.load(inv_scale_ptr + cols, mask=cols_ok, other=0.0)
    u = tl.where(cols_ok[None, :], (tl.maximum(x, 0.0) + 1e-6) * inv_scale[None, :], 0.0)
    top = tl.max(u, axis=1)
    top = tl.where(rows_ok, top, 1.0)
    # literals below fp32's smallest normal (1.2e-38) would make the expression fp64
    w = tl.where(cols_ok[None, :], tl.exp2(power * tl.log2(tl.maximum(u, 1e-30) / top[:, None])), 0.0)
    ratio = tl.sqrt(tl.sum(u * u, axis=1) / tl.sum(w * w, axis=1))
    tl.store(stats_ptr + (b * N + rows) * 2, top, mask=rows_ok)
    tl.store(stats_ptr + (b * N + rows) * 2 + 1, ratio, mask=rows_ok)


@triton.jit(do_not_specialize=("N",))
def focus_backward_kernel(
    x_ptr, g_ptr, inv_scale_ptr, stats_ptr, dx_ptr, part_ptr,
    sxb, sxn, sxc, sgb, sgn, sgc, sdb, sdn, sdc, N, C, power,
    CP: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    # With a² = ‖u‖² and γ = Σ_c g·f / a²: ∂u = p·(f/u)·(g − γ f) + γ u; ∂x = ∂u/softplus(scale) where x > 0;
    # the partial of ∂(1/softplus(scale))_c = Σ_n ∂u·(relu(x) + 1e-6) goes to part [B·blocks, C].
    block, b = tl.program_id(0), tl.program_id(1).to(tl.int64)
    rows = block * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, CP)
    rows_ok, cols_ok = rows < N, cols < C
    mask = rows_ok[:, None] & cols_ok[None, :]
    x = load_block(x_ptr + b * sxb, rows, rows_ok, cols, cols_ok, sxn, sxc)
    grad = load_block(g_ptr + b * sgb, rows, rows_ok, cols, cols_ok, sgn, sgc)
    inv_scale = tl.load(inv_scale_ptr + cols, mask=cols_ok, other=1.0)
    top = tl.load(stats_ptr + (b * N + rows) * 2, mask=rows_ok, other=1.0)
    ratio = tl.load(stats_ptr + (b * N + rows) * 2 + 1, mask=rows_ok, other=0.0)
    raw = tl.maximum(x, 0.0) + 1e-6
    u = raw * inv_scale[None, :]
    f = tl.where(mask, tl.exp2(power * tl.log2(u / top[:, None])) * ratio[:, None], 0.0)
    u = tl.where(mask, u, 0.0)
    gamma = tl.sum(grad * f, axis=1) / tl.maximum(tl.sum(u * u, axis=1), 1e-30)
    du = power * (f / tl.where(mask, u, 1.0)) * (grad - gamma[:, None] * f) + gamma[:, None] * u
    du = tl.where(mask, du, 0.0)
    dx = tl.where(x > 0, du * inv_scale[None, :], 0.0)
    dx_offsets = dx_ptr + b * sdb + rows[:, None].to(tl.int64) * sdn + cols[None, :] * sdc
    tl.store(dx_offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)
    tl.store(part_ptr + (b * tl.num_programs(0) + block) * C + cols, tl.sum(du * raw, axis=0), mask=cols_ok)
