"""Triton kernels of the ``triton`` route, the backward pass: the rows' ``rowsum(dO o)``, then a
key-block kernel (``dk``, ``dv`` and the prior's gradients that reduce along the queries) and a
query-block kernel (``dq`` and the row factor's gradient), each recomputing the weights of its tiles
from the forward's log-sum-exp (FlashAttention-2). The tile and its terms are ``triton_forward.py``'s.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_forward import (
    LOG2E,
    key_range,
    prior_bias,
    query_range,
    scaled_lag_term,
    uncut_keys_end,
    visible_mask,
)

#: A tile whose scaled lags fall in at most this many cells of the grid adds its grid gradient as
#: one sum per grid point (far from the diagonal, nearly every tile); other tiles add per cell.
GRID_WINDOW = tl.constexpr(4)


@triton.jit
def delta_rows_kernel(
    O, DO, DELTA_ROWS, N, DV, BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr, ACC: tl.constexpr
):
    """``rowsum(dO o)`` in ``ACC`` of BLOCK_M of the ``N`` rows of the output ``O`` and its gradient
    ``DO`` (``(N, DV)``, contiguous): the ``delta`` of ``dS = p (dP - delta)``, in one launch."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, BLOCK_DV)
    inside = (offs_m[:, None] < N) & (offs_dv[None, :] < DV)
    o = tl.load(O + offs_m[:, None] * DV + offs_dv[None, :], mask=inside, other=0.0).to(ACC)
    do = tl.load(DO + offs_m[:, None] * DV + offs_dv[None, :], mask=inside, other=0.0).to(ACC)
    tl.store(DELTA_ROWS + offs_m, tl.sum(o * do, 1), mask=offs_m < N)


@triton.jit
def key_block_kernel(
    Q,
    K,
    V,
    QL,
    KL,
    DO,
    LSE,
    DELTA_ROWS,
    DK,
    DV_OUT,
    DKL,
    DU,
    DSLOPE,
    DTABLE,
    dt_h,
    DGRID,
    DLAG_SCALE,
    U,
    U_LO,
    su_b,
    su_h,
    SLOPE,
    TABLE,
    st_h,
    F,
    sf_b,
    sf_h,
    LAG_SCALE,
    ROW_SCALE,
    GRID,
    sg_h,
    Q_DOC,
    K_DOC,
    sqd_b,
    skd_b,
    PAD,
    sp_b,
    sql_b,
    sql_h,
    sql_m,
    skl_b,
    skl_h,
    skl_n,
    H,
    GROUP,
    Lq,
    Lk,
    DELTA,
    WINDOW,
    SCALE,
    D,
    DV,
    P,
    NUM_KEY_BLOCKS,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_P: tl.constexpr,
    HAS_LANES: tl.constexpr,
    HAS_KEY_BIAS: tl.constexpr,
    HAS_LO: tl.constexpr,
    HAS_SLOPE: tl.constexpr,
    HAS_TABLE: tl.constexpr,
    HAS_ROW_FACTOR: tl.constexpr,
    HAS_GRID: tl.constexpr,
    GRID_CELLS: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_DOCS: tl.constexpr,
    HAS_PADDING: tl.constexpr,
    ALWAYS_MASK: tl.constexpr,
    KEY_BIAS_GRAD: tl.constexpr,
    SLOPE_GRAD: tl.constexpr,
    TABLE_GRAD: tl.constexpr,
    GRID_GRAD: tl.constexpr,
    LAG_SCALE_GRAD: tl.constexpr,
    ACC: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One block of BLOCK_N keys of one (batch row, key/value head), against every query head of
    its group: ``dk``, ``dv`` (and ``dkl``), and per query head the key bias's gradient (column sums
    of ``f dS``), the slope's partial sum and the lag table's diagonal sums.

    Tiles are held transposed, keys along rows: ``sT[j, i]``."""
    n0 = tl.program_id(0) * BLOCK_N
    bhk = tl.program_id(1)
    Hkv = H // GROUP
    b = bhk // Hkv
    hk = bhk % Hkv
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    keys = offs_n[:, None] < Lk
    k = tl.load(
        K + (bhk * Lk + offs_n[:, None]) * D + offs_d[None, :], mask=keys & (offs_d[None, :] < D), other=0.0
    )
    v = tl.load(
        V + (bhk * Lk + offs_n[:, None]) * DV + offs_dv[None, :],
        mask=keys & (offs_dv[None, :] < DV),
        other=0.0,
    )
    dk = tl.zeros([BLOCK_N, BLOCK_D], ACC)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], ACC)
    if HAS_LANES:
        offs_p = tl.arange(0, BLOCK_P)
        kl = tl.load(
            KL + b * skl_b + hk * skl_h + offs_n[:, None] * skl_n + offs_p[None, :],
            mask=keys & (offs_p[None, :] < P),
            other=0.0,
        ).to(Q.dtype.element_ty)
        dkl = tl.zeros([BLOCK_N, BLOCK_P], ACC)
    if TABLE_GRAD or LAG_SCALE_GRAD:
        # diagonal t of a tile holds lag offset i - j = t - (BLOCK_N - 1); gathered along the queries
        tl.static_assert(BLOCK_M == BLOCK_N, "a lag table's gradient takes square tiles")
        WIDTH: tl.constexpr = 2 * BLOCK_N
        diag = tl.arange(0, WIDTH)
        gather_at = diag[None, :] - (BLOCK_N - 1) + tl.arange(0, BLOCK_N)[:, None]  # (BLOCK_N, WIDTH)
        on_tile = (gather_at >= 0) & (gather_at < BLOCK_M)
        gather_at = tl.minimum(tl.maximum(gather_at, 0), BLOCK_M - 1)
    lo, hi = query_range(n0, BLOCK_M, BLOCK_N, Lq, DELTA, WINDOW, CAUSAL, HAS_WINDOW)
    first_full = n0 * 0  # query blocks from here on see every key of the block
    if CAUSAL:
        first_full = n0 + BLOCK_N - 1 - DELTA
    if n0 + BLOCK_N > Lk:  # the last key
        first_full = Lq
    if ALWAYS_MASK:  # documents, padding or a window: every tile is cut
        first_full = Lq
    for g in range(GROUP):
        h = hk * GROUP + g
        bh = b * H + h
        du = tl.zeros([BLOCK_N], ACC)
        dslope = tl.zeros([BLOCK_N], ACC)
        for m0 in range(lo, hi, BLOCK_M):
            offs_m = m0 + tl.arange(0, BLOCK_M)
            rows = offs_m[None, :] < Lq
            qT = tl.load(
                Q + (bh * Lq + offs_m[None, :]) * D + offs_d[:, None],
                mask=rows & (offs_d[:, None] < D),
                other=0.0,
            )
            qT = (qT * SCALE).to(Q.dtype.element_ty)  # the content queries, as the forward's
            sT = tl.dot(k, qT, out_dtype=ACC, input_precision=PRECISION)
            if HAS_LANES:
                qlT = tl.load(
                    QL + b * sql_b + h * sql_h + offs_m[None, :] * sql_m + offs_p[:, None],
                    mask=rows & (offs_p[:, None] < P),
                    other=0.0,
                ).to(Q.dtype.element_ty)
                sT += tl.dot(kl, qlT, out_dtype=ACC, input_precision=PRECISION)
            bias = prior_bias(
                offs_m[None, :],
                offs_n[:, None],
                b,
                h,
                Lq,
                Lk,
                DELTA,
                U,
                U_LO,
                su_b,
                su_h,
                SLOPE,
                TABLE,
                st_h,
                LAG_SCALE,
                ROW_SCALE,
                GRID,
                sg_h,
                HAS_KEY_BIAS,
                HAS_LO,
                HAS_SLOPE,
                HAS_TABLE,
                HAS_GRID,
                GRID_CELLS,
                ACC,
            )
            if HAS_ROW_FACTOR:
                f = tl.load(F + b * sf_b + h * sf_h + offs_m, mask=offs_m < Lq, other=0.0).to(ACC)
                bias = bias * f[None, :]
            # rows past Lq read lse = inf: weight 0 without a mask
            lse = tl.load(LSE + bh * Lq + offs_m, mask=offs_m < Lq, other=float("inf"))
            pT = tl.math.exp2((sT + bias - lse[None, :]) * LOG2E)
            if m0 < first_full:  # a tile the causal diagonal, the last key or a mask cuts
                visible = visible_mask(
                    offs_m[None, :],
                    offs_n[:, None],
                    b,
                    Lq,
                    Lk,
                    DELTA,
                    WINDOW,
                    Q_DOC,
                    K_DOC,
                    sqd_b,
                    skd_b,
                    PAD,
                    sp_b,
                    CAUSAL,
                    HAS_WINDOW,
                    HAS_DOCS,
                    HAS_PADDING,
                )
                pT = tl.where(visible, pT, 0.0)
            do = tl.load(
                DO + (bh * Lq + offs_m[:, None]) * DV + offs_dv[None, :],
                mask=(offs_m[:, None] < Lq) & (offs_dv[None, :] < DV),
                other=0.0,
            )
            dv += tl.dot(pT.to(do.dtype), do, out_dtype=ACC, input_precision=PRECISION)
            dpT = tl.dot(v, tl.trans(do), out_dtype=ACC, input_precision=PRECISION)
            delta = tl.load(DELTA_ROWS + bh * Lq + offs_m, mask=offs_m < Lq, other=0.0)
            dsT = pT * (dpT - delta[None, :])
            dk += tl.dot(dsT.to(qT.dtype), tl.trans(qT), out_dtype=ACC, input_precision=PRECISION)
            if HAS_LANES:
                dkl += tl.dot(dsT.to(qlT.dtype), tl.trans(qlT), out_dtype=ACC, input_precision=PRECISION)
            if HAS_ROW_FACTOR:
                dsT = dsT * f[None, :]
            if KEY_BIAS_GRAD:
                du += tl.sum(dsT, 1)
            if SLOPE_GRAD:  # d/dm of -m (DELTA + i - j)
                dslope -= tl.sum(dsT * (DELTA + offs_m[None, :] - offs_n[:, None]).to(ACC), 1)
            if TABLE_GRAD:
                add_diagonal_sums(
                    dsT, on_tile, gather_at, diag, m0, n0, DTABLE + h * dt_h, Lq, Lk, BLOCK_M, BLOCK_N
                )
            if GRID_GRAD or LAG_SCALE_GRAD:
                _value, slope, _a, r, cell, t = scaled_lag_term(
                    offs_m[None, :],
                    offs_n[:, None],
                    h,
                    Lq,
                    Lk,
                    LAG_SCALE,
                    ROW_SCALE,
                    GRID,
                    sg_h,
                    GRID_CELLS,
                    ACC,
                )
                if GRID_GRAD:
                    add_to_grid(dsT, cell, t, DGRID + h * (GRID_CELLS + 1), GRID_CELLS)
                if LAG_SCALE_GRAD:  # dx / da = r
                    dx = dsT * slope * r
                    base = DLAG_SCALE + h * (Lq + Lk - 1)
                    add_diagonal_sums(dx, on_tile, gather_at, diag, m0, n0, base, Lq, Lk, BLOCK_M, BLOCK_N)
        if KEY_BIAS_GRAD:
            tl.store(DU + bh * Lk + offs_n, du, mask=offs_n < Lk)
        if SLOPE_GRAD:
            tl.store(DSLOPE + bh * NUM_KEY_BLOCKS + tl.program_id(0), tl.sum(dslope, 0))
    tl.store(
        DK + (bhk * Lk + offs_n[:, None]) * D + offs_d[None, :],
        dk.to(DK.dtype.element_ty),
        mask=keys & (offs_d[None, :] < D),
    )
    tl.store(
        DV_OUT + (bhk * Lk + offs_n[:, None]) * DV + offs_dv[None, :],
        dv.to(DV_OUT.dtype.element_ty),
        mask=keys & (offs_dv[None, :] < DV),
    )
    if HAS_LANES:
        tl.store(
            DKL + (bhk * Lk + offs_n[:, None]) * P + offs_p[None, :],
            dkl.to(DKL.dtype.element_ty),
            mask=keys & (offs_p[None, :] < P),
        )


@triton.jit
def add_diagonal_sums(
    tileT, on_tile, gather_at, diag, m0, n0, OUT, Lq, Lk, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    """Add the sums along the diagonals of a (keys x queries) tile to ``OUT`` at their lag index
    ``i - j + Lk - 1``: one atomic add per lag of the tile."""
    sums = tl.sum(tl.where(on_tile, tl.gather(tileT, gather_at, 1), 0.0), 0)  # (2 BLOCK_N,)
    col = m0 - n0 + diag - (BLOCK_N - 1) + Lk - 1
    live = (diag < BLOCK_M + BLOCK_N - 1) & (col >= 0) & (col < Lq + Lk - 1)
    tl.atomic_add(OUT + col, sums, mask=live)


@triton.jit
def add_to_grid(dsT, cell, t, OUT, GRID_CELLS: tl.constexpr):
    """Add a tile's gradient of the grid's points to ``OUT``: each cell's ``dS`` splits between the
    two ends of its grid cell as the interpolation weights them, ``1 - t`` and ``t``. A tile within
    :data:`GRID_WINDOW` cells adds one sum per grid point; a wider one (near the diagonal, where
    every lag has its own cell) adds per cell."""
    live = dsT != 0.0
    first = tl.min(tl.min(tl.where(live, cell, GRID_CELLS), 1), 0)
    last = tl.max(tl.max(tl.where(live, cell, 0), 1), 0)
    upper = dsT * t
    lower = dsT - upper
    if last - first < GRID_WINDOW:
        for o in tl.static_range(GRID_WINDOW + 1):
            point = first + o
            both = tl.where(cell == point, lower, 0.0) + tl.where(cell == point - 1, upper, 0.0)
            tl.atomic_add(OUT + point, tl.sum(tl.sum(both, 1), 0), mask=point <= GRID_CELLS)
    else:
        tl.atomic_add(OUT + cell, lower, mask=live)
        tl.atomic_add(OUT + cell + 1, upper, mask=live)


@triton.jit
def query_block_kernel(
    Q,
    K,
    V,
    QL,
    KL,
    DO,
    LSE,
    DELTA_ROWS,
    DQ,
    DQL,
    DF,
    DU,
    DROW_SCALE,
    U,
    U_LO,
    su_b,
    su_h,
    SLOPE,
    TABLE,
    st_h,
    F,
    sf_b,
    sf_h,
    LAG_SCALE,
    ROW_SCALE,
    GRID,
    sg_h,
    Q_DOC,
    K_DOC,
    sqd_b,
    skd_b,
    PAD,
    sp_b,
    sql_b,
    sql_h,
    sql_m,
    skl_b,
    skl_h,
    skl_n,
    H,
    GROUP,
    Lq,
    Lk,
    DELTA,
    WINDOW,
    SCALE,
    D,
    DV,
    P,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_P: tl.constexpr,
    HAS_LANES: tl.constexpr,
    HAS_KEY_BIAS: tl.constexpr,
    HAS_LO: tl.constexpr,
    HAS_SLOPE: tl.constexpr,
    HAS_TABLE: tl.constexpr,
    HAS_ROW_FACTOR: tl.constexpr,
    HAS_GRID: tl.constexpr,
    GRID_CELLS: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_DOCS: tl.constexpr,
    HAS_PADDING: tl.constexpr,
    ALWAYS_MASK: tl.constexpr,
    ROW_FACTOR_GRAD: tl.constexpr,
    KEY_BIAS_GRAD: tl.constexpr,
    ROW_SCALE_GRAD: tl.constexpr,
    ACC: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One block of BLOCK_M query rows of one (batch row, head): ``dq`` (and ``dql``), the row
    factor's gradient (the row sums of ``dS`` times the prior's terms), and the key bias's centre
    ``u_t(i)``'s gradient, minus row i's sum of ``f dS``, added into ``DU`` at key ``t(i)``, where
    the key-block kernel, launched first, stored the column sums.

    That centre's gradient is 0 in exact arithmetic, but a recomputed softmax's rows of dS do not
    sum to exactly 0, and FoX's gate sums its key bias's gradient over all later keys, where these
    leftovers pile up: differentiating what the kernels computed cancels them."""
    m0 = (tl.num_programs(0) - 1 - tl.program_id(0)) * BLOCK_M  # the longest rows first
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    bhk = b * (H // GROUP) + h // GROUP
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    rows = offs_m[:, None] < Lq
    q = tl.load(
        Q + (bh * Lq + offs_m[:, None]) * D + offs_d[None, :], mask=rows & (offs_d[None, :] < D), other=0.0
    )
    q = (q * SCALE).to(Q.dtype.element_ty)  # the content queries, as the forward's
    do = tl.load(
        DO + (bh * Lq + offs_m[:, None]) * DV + offs_dv[None, :],
        mask=rows & (offs_dv[None, :] < DV),
        other=0.0,
    )
    lse = tl.load(LSE + bh * Lq + offs_m, mask=offs_m < Lq, other=float("inf"))
    delta = tl.load(DELTA_ROWS + bh * Lq + offs_m, mask=offs_m < Lq, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], ACC)
    if HAS_LANES:
        offs_p = tl.arange(0, BLOCK_P)
        ql = tl.load(
            QL + b * sql_b + h * sql_h + offs_m[:, None] * sql_m + offs_p[None, :],
            mask=rows & (offs_p[None, :] < P),
            other=0.0,
        ).to(Q.dtype.element_ty)
        dql = tl.zeros([BLOCK_M, BLOCK_P], ACC)
    if HAS_ROW_FACTOR:
        f = tl.load(F + b * sf_b + h * sf_h + offs_m, mask=offs_m < Lq, other=0.0).to(ACC)
        df = tl.zeros([BLOCK_M], ACC)
    row_sums = tl.zeros([BLOCK_M], ACC)
    d_row_scale = tl.zeros([BLOCK_M], ACC)
    lo, hi = key_range(m0, BLOCK_M, BLOCK_N, Lk, DELTA, WINDOW, CAUSAL, HAS_WINDOW)
    full_end = uncut_keys_end(m0, Lk, DELTA, CAUSAL, ALWAYS_MASK)
    for n0 in range(lo, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        keys = offs_n[:, None] < Lk
        k = tl.load(
            K + (bhk * Lk + offs_n[:, None]) * D + offs_d[None, :],
            mask=keys & (offs_d[None, :] < D),
            other=0.0,
        )
        s = tl.dot(q, tl.trans(k), out_dtype=ACC, input_precision=PRECISION)
        if HAS_LANES:
            kl = tl.load(
                KL + b * skl_b + (h // GROUP) * skl_h + offs_n[:, None] * skl_n + offs_p[None, :],
                mask=keys & (offs_p[None, :] < P),
                other=0.0,
            ).to(Q.dtype.element_ty)
            s += tl.dot(ql, tl.trans(kl), out_dtype=ACC, input_precision=PRECISION)
        bias = prior_bias(
            offs_m[:, None],
            offs_n[None, :],
            b,
            h,
            Lq,
            Lk,
            DELTA,
            U,
            U_LO,
            su_b,
            su_h,
            SLOPE,
            TABLE,
            st_h,
            LAG_SCALE,
            ROW_SCALE,
            GRID,
            sg_h,
            HAS_KEY_BIAS,
            HAS_LO,
            HAS_SLOPE,
            HAS_TABLE,
            HAS_GRID,
            GRID_CELLS,
            ACC,
        )
        # rows past Lq read lse = inf: weight 0 without a mask
        if HAS_ROW_FACTOR:
            p = tl.math.exp2((s + bias * f[:, None] - lse[:, None]) * LOG2E)
        else:
            p = tl.math.exp2((s + bias - lse[:, None]) * LOG2E)
        if n0 + BLOCK_N > full_end:  # a tile the causal diagonal, the last key or a mask cuts
            visible = visible_mask(
                offs_m[:, None],
                offs_n[None, :],
                b,
                Lq,
                Lk,
                DELTA,
                WINDOW,
                Q_DOC,
                K_DOC,
                sqd_b,
                skd_b,
                PAD,
                sp_b,
                CAUSAL,
                HAS_WINDOW,
                HAS_DOCS,
                HAS_PADDING,
            )
            p = tl.where(visible, p, 0.0)
        v = tl.load(
            V + (bhk * Lk + offs_n[:, None]) * DV + offs_dv[None, :],
            mask=keys & (offs_dv[None, :] < DV),
            other=0.0,
        )
        dp = tl.dot(do, tl.trans(v), out_dtype=ACC, input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, out_dtype=ACC, input_precision=PRECISION)
        if HAS_LANES:
            dql += tl.dot(ds.to(kl.dtype), kl, out_dtype=ACC, input_precision=PRECISION)
        if ROW_FACTOR_GRAD:
            df += tl.sum(ds * bias, 1)
        if KEY_BIAS_GRAD:
            row_sums += tl.sum(ds, 1)
        if ROW_SCALE_GRAD:  # dx / dr = a
            _value, slope, a, _r, _cell, _t = scaled_lag_term(
                offs_m[:, None], offs_n[None, :], h, Lq, Lk, LAG_SCALE, ROW_SCALE, GRID, sg_h, GRID_CELLS, ACC
            )
            if HAS_ROW_FACTOR:
                d_row_scale += tl.sum(ds * f[:, None] * slope * a, 1)
            else:
                d_row_scale += tl.sum(ds * slope * a, 1)
    tl.store(
        DQ + (bh * Lq + offs_m[:, None]) * D + offs_d[None, :],
        (dq * SCALE).to(DQ.dtype.element_ty),  # the content queries' gradient times d(c q)/dq
        mask=rows & (offs_d[None, :] < D),
    )
    if HAS_LANES:
        tl.store(
            DQL + (bh * Lq + offs_m[:, None]) * P + offs_p[None, :],
            dql.to(DQL.dtype.element_ty),
            mask=rows & (offs_p[None, :] < P),
        )
    if ROW_FACTOR_GRAD:
        tl.store(DF + bh * Lq + offs_m, df, mask=offs_m < Lq)
    if KEY_BIAS_GRAD:
        if HAS_ROW_FACTOR:
            row_sums = row_sums * f
        own = tl.minimum(tl.maximum(offs_m + Lk - Lq, 0), Lk - 1)  # rows share a key only past Lk
        tl.atomic_add(DU + bh * Lk + own, -row_sums, mask=offs_m < Lq)
    if ROW_SCALE_GRAD:
        tl.store(DROW_SCALE + bh * Lq + offs_m, d_row_scale, mask=offs_m < Lq)
