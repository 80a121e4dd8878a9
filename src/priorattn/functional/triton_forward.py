"""Triton kernels of the ``triton`` route, the forward pass and the tile helpers the backward shares:
flash attention with a prior's terms inside the kernel.

One tile of logits, queries ``i`` (positions ``q0 + i``) against keys ``j`` (``k0 + j``), is

    s_ij = <c q_i, k_j> + <ql_i, kl_j> + f_i (u_j - u_t(i) - m_h lag_ij + T_h[lag_ij]),
    lag_ij = q0 - k0 + i - j,

with ``c`` the content scale (``SCALE``: 1 where the route scaled ``q`` itself; the kernels scale
each tile of ``q`` as they load it, in float32, rounded to ``q``'s dtype), ``ql``/``kl`` a
fold's lanes (seed 000 Eq. 20-24), ``u`` a key bias centred on each row's own key ``t(i)`` (a row
constant: the softmax is unchanged, the near keys keep their precision however far ``u`` drifts),
``m_h`` a slope and ``T_h`` a lag table, ``f_i`` a row factor (SSMax, a query gate). The forward
pass is FlashAttention-2's online softmax; the backward recomputes the weights ``p`` tile by tile
and forms ``dS = p (dP - rowsum(dO o))``. The prior's gradients are reductions of ``f dS`` kept in
registers: column sums for ``u`` (in the key-block kernel, which owns a block of keys), a sum times
the lag for ``m``, diagonal sums for ``T`` (one atomic add per lag of a tile, not per pair) and row
sums times the bias for ``f``.

Lag index ``i - j + Lk - 1`` of the table holds the lag of query ``i`` and key ``j``. The backward
kernels are in ``triton_backward.py``.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)  # exp(x) = exp2(x log2 e)


@triton.jit
def key_range(
    m0,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    Lk,
    DELTA,
    WINDOW,
    CAUSAL: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
):
    """Keys ``[lo, hi)`` that queries ``[m0, m0 + BLOCK_M)`` may see; ``lo`` a multiple of BLOCK_N."""
    lo = m0 * 0
    hi = m0 * 0 + Lk
    if CAUSAL:  # j <= i + DELTA
        last = m0 + BLOCK_M + DELTA
        if last < hi:
            hi = last
    if HAS_WINDOW:  # lag < WINDOW (and > -WINDOW both ways)
        first = m0 + DELTA - WINDOW + 1
        if first > lo:
            lo = first
        if not CAUSAL:
            last = m0 + BLOCK_M + DELTA + WINDOW - 1
            if last < hi:
                hi = last
    lo = (lo // BLOCK_N) * BLOCK_N
    return lo, hi


@triton.jit
def query_range(
    n0,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    Lq,
    DELTA,
    WINDOW,
    CAUSAL: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
):
    """Queries ``[lo, hi)`` that may see keys ``[n0, n0 + BLOCK_N)``; ``lo`` a multiple of BLOCK_M."""
    lo = n0 * 0
    hi = n0 * 0 + Lq
    if CAUSAL:  # i >= j - DELTA
        first = n0 - DELTA
        if first > lo:
            lo = first
    if HAS_WINDOW:  # i < j - DELTA + WINDOW (and i > j - DELTA - WINDOW both ways)
        last = n0 + BLOCK_N - DELTA + WINDOW - 1
        if last < hi:
            hi = last
        if not CAUSAL:
            first = n0 - DELTA - WINDOW + 1
            if first > lo:
                lo = first
    lo = (lo // BLOCK_M) * BLOCK_M
    return lo, hi


@triton.jit
def uncut_keys_end(m0, Lk, DELTA, CAUSAL: tl.constexpr, ALWAYS_MASK: tl.constexpr):
    """Keys before this one are visible to every row from ``m0`` on: tiles of them need no mask
    (0 where documents, padding or a window may hide any key)."""
    end = m0 * 0 + Lk
    if CAUSAL:  # j <= m0 + DELTA
        if m0 + DELTA + 1 < end:
            end = m0 + DELTA + 1
    if ALWAYS_MASK:
        end = m0 * 0
    return end


@triton.jit
def visible_mask(
    i,
    j,
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
    CAUSAL: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_DOCS: tl.constexpr,
    HAS_PADDING: tl.constexpr,
):
    """Whether the masks let query ``i`` see key ``j``, on a tile of indices (broadcastable 2-D)."""
    lag = DELTA + i - j
    visible = (i < Lq) & (j < Lk)
    if CAUSAL:
        visible = visible & (lag >= 0)
    if HAS_WINDOW:
        if CAUSAL:
            visible = visible & (lag < WINDOW)
        else:
            visible = visible & (lag < WINDOW) & (lag > -WINDOW)
    if HAS_DOCS:
        q_doc = tl.load(Q_DOC + b * sqd_b + i, mask=i < Lq, other=-1)
        k_doc = tl.load(K_DOC + b * skd_b + j, mask=j < Lk, other=-2)
        visible = visible & (q_doc == k_doc)
    if HAS_PADDING:
        visible = visible & (tl.load(PAD + b * sp_b + j, mask=j < Lk, other=1) == 0)
    return visible


@triton.jit
def prior_bias(
    i,
    j,
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
    HAS_KEY_BIAS: tl.constexpr,
    HAS_LO: tl.constexpr,
    HAS_SLOPE: tl.constexpr,
    HAS_TABLE: tl.constexpr,
    HAS_GRID: tl.constexpr,
    GRID_CELLS: tl.constexpr,
    ACC: tl.constexpr,
):
    """The prior's terms before the row factor on a tile of query indices ``i`` and key indices
    ``j`` (broadcastable 2-D); finite wherever the indices lie outside ``Lq`` and ``Lk``."""
    lag = DELTA + i - j
    bias = tl.zeros(lag.shape, ACC)
    if HAS_KEY_BIAS:  # u_j - u_t(i): near keys' differences first, exact (Sterbenz)
        own = tl.minimum(tl.maximum(i + Lk - Lq, 0), Lk - 1)
        base = U + b * su_b + h * su_h
        bias += tl.load(base + j, mask=j < Lk, other=0.0).to(ACC) - tl.load(base + own).to(ACC)
        if HAS_LO:  # what rounding u to the kernel's dtype dropped
            base_lo = U_LO + b * su_b + h * su_h
            bias += tl.load(base_lo + j, mask=j < Lk, other=0.0).to(ACC) - tl.load(base_lo + own).to(ACC)
    if HAS_SLOPE:  # -m_h (i - j), from the exact integer lag
        bias -= tl.load(SLOPE + h).to(ACC) * lag.to(ACC)
    if HAS_TABLE:
        inside = (i < Lq) & (j < Lk)
        bias += tl.load(TABLE + h * st_h + (i - j + Lk - 1), mask=inside, other=0.0).to(ACC)
    if HAS_GRID:
        value, _slope, _a, _r, _cell, _t = scaled_lag_term(
            i, j, h, Lq, Lk, LAG_SCALE, ROW_SCALE, GRID, sg_h, GRID_CELLS, ACC
        )
        bias += value
    return bias


@triton.jit
def scaled_lag_term(
    i, j, h, Lq, Lk, LAG_SCALE, ROW_SCALE, GRID, sg_h, GRID_CELLS: tl.constexpr, ACC: tl.constexpr
):
    """A prior of the scaled lag ``x = a[i - j + Lk - 1] r[i]`` in ``[0, 1]`` (FIRE), linear between
    the points ``m / GRID_CELLS`` of its grid: the value, the slope ``dg/dx`` of the cell, ``a``,
    ``r``, the cell ``m`` and ``x``'s place ``t`` in it, in ``[0, 1)``."""
    inside = (i < Lq) & (j < Lk)
    a = tl.load(LAG_SCALE + (i - j + Lk - 1), mask=inside, other=0.0).to(ACC)
    r = tl.load(ROW_SCALE + i, mask=i < Lq, other=0.0).to(ACC)
    u = tl.minimum(tl.maximum(a * r, 0.0), 1.0) * GRID_CELLS  # masked cells (keys after i) clamp to 0
    cell = tl.minimum(u.to(tl.int32), GRID_CELLS - 1)
    t = u - cell.to(ACC)
    g0 = tl.load(GRID + h * sg_h + cell).to(ACC)
    g1 = tl.load(GRID + h * sg_h + cell + 1).to(ACC)
    return g0 + t * (g1 - g0), (g1 - g0) * GRID_CELLS, a, r, cell, t


@triton.jit
def forward_kernel(
    Q,
    K,
    V,
    QL,
    KL,
    O,
    LSE,
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
    ACC: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One block of BLOCK_M query rows of one (batch row, head): ``O`` and the natural-log
    log-sum-exp ``LSE`` (+inf for a row that sees no key, whose output is 0)."""
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
    q = (q * SCALE).to(Q.dtype.element_ty)  # the content queries c q, rounded once as q is
    if HAS_LANES:
        offs_p = tl.arange(0, BLOCK_P)
        ql = tl.load(
            QL + b * sql_b + h * sql_h + offs_m[:, None] * sql_m + offs_p[None, :],
            mask=rows & (offs_p[None, :] < P),
            other=0.0,
        ).to(Q.dtype.element_ty)
    if HAS_ROW_FACTOR:
        f = tl.load(F + b * sf_b + h * sf_h + offs_m, mask=offs_m < Lq, other=0.0).to(ACC)
    m_i = tl.full([BLOCK_M], float("-inf"), ACC)
    l_i = tl.zeros([BLOCK_M], ACC)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], ACC)
    lo, hi = key_range(m0, BLOCK_M, BLOCK_N, Lk, DELTA, WINDOW, CAUSAL, HAS_WINDOW)
    full_end = uncut_keys_end(m0, Lk, DELTA, CAUSAL, ALWAYS_MASK)
    for n0 in range(lo, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        keys = offs_n[None, :] < Lk
        kT = tl.load(
            K + (bhk * Lk + offs_n[None, :]) * D + offs_d[:, None],
            mask=keys & (offs_d[:, None] < D),
            other=0.0,
        )
        s = tl.dot(q, kT, out_dtype=ACC, input_precision=PRECISION)
        if HAS_LANES:
            klT = tl.load(
                KL + b * skl_b + (h // GROUP) * skl_h + offs_n[None, :] * skl_n + offs_p[:, None],
                mask=keys & (offs_p[:, None] < P),
                other=0.0,
            ).to(Q.dtype.element_ty)
            s += tl.dot(ql, klT, out_dtype=ACC, input_precision=PRECISION)
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
        if HAS_ROW_FACTOR:
            bias = bias * f[:, None]
        s = s + bias
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
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet
        p = tl.math.exp2((s - m_safe[:, None]) * LOG2E)
        alpha = tl.math.exp2((m_i - m_safe) * LOG2E)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            V + (bhk * Lk + offs_n[:, None]) * DV + offs_dv[None, :],
            mask=(offs_n[:, None] < Lk) & (offs_dv[None, :] < DV),
            other=0.0,
        )
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, out_dtype=ACC, input_precision=PRECISION)
        m_i = m_new
    seen = l_i > 0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse = tl.where(seen, m_i + tl.log(tl.where(seen, l_i, 1.0)), float("inf"))
    tl.store(
        O + (bh * Lq + offs_m[:, None]) * DV + offs_dv[None, :],
        out.to(O.dtype.element_ty),
        mask=rows & (offs_dv[None, :] < DV),
    )
    tl.store(LSE + bh * Lq + offs_m, lse, mask=offs_m < Lq)
