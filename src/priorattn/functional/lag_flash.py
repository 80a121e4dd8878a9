"""The blockwise route's fast path: a lag table through PyTorch's fused CPU flash kernel.

When a call's bias depends on the lag ``i - j`` only (a relative prior's table, or no prior) and so
do its masks (causal order, a sliding window), both fit in one table: the prior's values with
-inf at the lags no query may see. A block of it is Toeplitz (constant along diagonals); with the
block's keys in reverse order (or its queries and the table) it is a Hankel view
(:func:`hankel_mask`) that the kernel ``_scaled_dot_product_flash_attention_for_cpu`` accepts as
its additive mask without a copy. Each block of query rows calls the kernel once, against the keys
its rows can see (``key_blocks``: a causal block skips the keys after its last query), narrowed
per head to the keys whose weight can reach ``sqrt(finfo.tiny)`` (:func:`weight_bands`): a steep
prior (GGD, ALiBi) gives the rest weights far below the dtype's resolution, so neither pass
computes them.

A prior constant past a lag by construction (``Prior.constant_beyond``: T5, whose distances from
about ``max_distance`` on share one bucket) gives, under plain causal masking, most cells of a long
call one bias per head: those run as one plain causal kernel call, forward and backward, its bias a
shift of the log-sum-exp (:class:`FarRegion`), and only each row's nearer lags go through the table.

Backward without a prior: the kernel's own, per block. With one: the gradient of a lag is the sum
of ``dS = P (dP - delta)`` along its diagonal, which needs P and dP cell by cell: small tiles (one
head, :func:`tile_rows` rows, their visible keys) rebuild them, with ``delta`` summed from the
tile's own ``P dP`` so that a row with one weight of exactly 1 gets ``dS = 0`` exactly (see
``BlockwiseAttention.backward``); P is the softmax of the tile's logits and dS its backward, each
one fused pass in place, with subnormals flushed (``subnormals.py``). A frozen prior takes the
tiles too: a decaying bias puts many weights below float32's normal range, and the kernel's
backward computes those subnormal numbers at full cost (ALiBi through it: 3.1x plain SDPA's time at
L = 4096, against 1.5x for the tiles).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..priors import Prior
from .inplace import softmax_, softmax_backward_
from .masks import Masking
from .spans import cut
from .subnormals import flushing_subnormals

flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward

#: Query rows per tile of the table's backward (at most: see :func:`tile_rows`), cells per tile
#: (heads x rows x keys): few enough that a tile's weights stay in the core's cache between the
#: products that use them, many enough that short rows take several heads at once (a tile's dozen
#: calls cost their overhead), and cells of the tile's buffers at most (rows x keys).
TILE_ROWS, TILE_CELLS, TILE_BUFFER = 256, 1 << 18, 1 << 21
#: Query rows per call of the flash kernel: a causal call also computes the hidden upper triangle
#: of its newest keys, ``FLASH_ROWS / L`` of its work.
FLASH_ROWS = 256
#: Query rows per call of the flash kernel on a far region's near band, whose rows see a horizon of
#: keys each (:class:`FarRegion`): a T5 (horizon 113) at L = 1024 and 2048 took longest with 256 and
#: 32 rows, least with 64. And the side of the far region's causal triangle, in horizons, from which
#: on that region runs as plain SDPA: its calls and the near band's many small ones cost more than
#: they save below (T5 at L = 2048, a side of 17 horizons, 1.48x plain SDPA either way; at 4096
#: 1.32x against 1.45x).
NEAR_ROWS, FAR_SIDE = 64, 16
#: Keys per call of the kernel's backward: it returns fresh ``dk, dv`` for the keys it is given, two
#: ``(B, H, keys, D)`` tensors on top of the whole-length sums (at L = 16384 and the whole row they
#: were 32 MB, the route's peak memory 1.15x plain SDPA's). Rows split over key runs this long
#: give the same gradients (each run's ``dS`` uses the row's own log-sum-exp and ``rowsum(dO O)``).
BACKWARD_KEYS = 2048


def lag_flash_applies(prior: Prior | None, masking: Masking, q: Tensor, v: Tensor, row_scaled: bool) -> bool:
    """Whether :func:`lag_flash_attention` computes this call: a relative prior or none, a CPU call
    outside ``torch.compile``, positions one run shared by the batch, masks on lags only, the prior
    not scaled per row (``row_scaled``: by SSMax or a query gate), equal q/k and v head widths (the
    kernel's requirement)."""
    return (
        (prior is None or prior.is_relative and not row_scaled)
        and q.device.type == "cpu"
        and not torch.compiler.is_compiling()
        and masking.starts is not None
        and masking.q_doc is None
        and masking.key_padding is None
        and q.shape[-1] == v.shape[-1]
    )


def masked_table(table: Tensor | None, masking: Masking, dtype: torch.dtype) -> Tensor:
    """``(H or 1, Lq + Lk - 1)``: the lag table (zeros without a prior) with -inf at hidden lags."""
    Lq, Lk = masking.q_pos.shape[-1], masking.k_pos.shape[-1]
    lags = (
        masking.q_start - (masking.k_start + Lk - 1) + torch.arange(Lq + Lk - 1, device=masking.q_pos.device)
    )
    if table is None:
        table = torch.zeros(1, Lq + Lk - 1, dtype=dtype, device=lags.device)
    return table.masked_fill(~masking.lag_visible(lags), float("-inf"))


def empty_rows(table: Tensor, Lk: int) -> Tensor | None:
    """``(H or 1, Lq)`` bool: rows whose every logit is -inf, or None when there are none.

    Row i reads table entries ``i .. i + Lk - 1``. The kernel gives such a row zeros; the tiles'
    softmax would give NaN, so the backward zeroes their weights.
    """
    finite = F.pad(torch.isfinite(table).long().cumsum(-1), (1, 0))
    empty = finite[:, Lk:] == finite[:, :-Lk]
    return empty if bool(empty.any()) else None


def hankel_mask(table: Tensor, B: int, H: int, rows: slice, cols: slice, start: int) -> Tensor:
    """``(B, H, lq, lk)`` view of ``table`` whose cell ``(i, j)`` reads ``start + i + j``, for query
    ``rows`` against key ``cols`` with one of the two taken in reverse order (:func:`keys_reversed`,
    :func:`queries_reversed`). ``as_strided`` reads it without a copy; batch and a one-row table
    broadcast with stride 0."""
    head_stride = table.stride(0) if table.shape[0] > 1 else 0
    shape = (B, H, rows.stop - rows.start, cols.stop - cols.start)
    return table.as_strided(shape, (0, head_stride, 1, 1), table.storage_offset() + start)


def keys_reversed(rows: slice, cols: slice, Lk: int) -> int:
    """Start of :func:`hankel_mask` in the table for keys in reverse order, ``j' = cols.stop - 1 - j``:
    query i and key j read ``i - j + Lk - 1 = rows.start - cols.stop + Lk + (i - rows.start) + j'``."""
    return rows.start - cols.stop + Lk


def queries_reversed(rows: slice, cols: slice, Lq: int) -> int:
    """Start of :func:`hankel_mask` in the *reversed* table for queries in reverse order,
    ``i' = rows.stop - 1 - i``: query i and key j read reversed index ``Lq - 1 - i + j
    = Lq - rows.stop + cols.start + i' + (j - cols.start)``."""
    return Lq - rows.stop + cols.start


def query_heads(x: Tensor, H: int) -> Tensor:
    """``(B, Hkv, Lk, D) -> (B, H, Lk, D)``: each key/value head repeated for its query heads (the
    kernel takes as many as queries)."""
    return x if x.shape[1] == H else x.repeat_interleave(H // x.shape[1], dim=1)


def key_heads(grad: Tensor, Hkv: int) -> Tensor:
    """``(B, H, Lk, D) -> (B, Hkv, Lk, D)``: the gradients of :func:`query_heads`' copies summed (and
    no copy without grouping)."""
    B, H, Lk, D = grad.shape
    return grad if H == Hkv else grad.view(B, Hkv, H // Hkv, Lk, D).sum(2)


def shifted_row_sums(padded: Tensor) -> Tensor:
    """Anti-diagonal sums of ``x`` ``(..., n, m)`` from its rows padded with ``n`` zeros on the right,
    ``padded = [x, 0]`` ``(..., n, m + n)`` (contiguous): ``(..., n + m - 1)``.

    Read with rows one shorter, the flat buffer shifts row ``i`` right by ``i``, so column ``i + j``
    collects ``x[..., i, j]``.
    """
    n, width = padded.shape[-2:]
    flat = padded.flatten(-2)[..., : n * (width - 1)]
    return flat.view(*padded.shape[:-2], n, width - 1).sum(-2)


def anti_diagonal_sums(x: Tensor) -> Tensor:
    """``s[..., c] = sum over i + j = c of x[..., i, j]``: ``(..., n, m) -> (..., n + m - 1)``; the
    gradient of a Hankel view with respect to the table it reads."""
    return shifted_row_sums(F.pad(x, (0, x.shape[-2])))


class LagTableFlash(torch.autograd.Function):
    """Flash attention with a Hankel-viewed lag table as its bias (see the module docstring).

    The forward pass gives the kernel the keys in reverse order, newest first: a row meets its
    largest logits first, so the kernel's running maximum rarely moves (with the oldest keys first
    a decaying bias made it 1.5x slower). Those reversed copies are freed when it returns; the
    backward pass reverses each block's queries instead, so nothing of size ``L`` is copied.
    """

    @staticmethod
    def forward(ctx, blocks, q, k, v, table, prior_bias, far):
        """``blocks(step)``: query rows in runs of ``step`` and the key columns they see. ``q, k,
        v`` may be in half precision, the table is in the dtype the kernel sums in (its
        log-sum-exp's). ``far``: the :class:`FarRegion` of a table constant beyond a lag, or None."""
        B, H, Lq, _ = q.shape
        Lk = k.shape[2]
        near = table if far is None else far.near(table)
        ctx.bands = call_bands(blocks if far is None else far.near_blocks(blocks), near, q, k)
        k_rev, v_rev = query_heads(k, H).flip(2), query_heads(v, H).flip(2)
        out = q.new_zeros(B, H, Lq, v.shape[-1])  # rows that see no key (or none in a band) stay 0
        # A row of no band sums nothing: -inf where the far region's sums join it.
        log_sum_exp = table.new_full((B, H, Lq), 0.0 if far is None else -math.inf)
        for rows, heads, cols in ctx.bands(FLASH_ROWS if far is None else NEAR_ROWS):
            keys = slice(Lk - cols.stop, Lk - cols.start)
            mask = hankel_mask(near, B, H, rows, cols, keys_reversed(rows, cols, Lk))[:, heads]
            out[:, heads, rows], log_sum_exp[:, heads, rows] = flash(
                q[:, heads, rows],
                k_rev[:, heads, keys],
                v_rev[:, heads, keys],
                0.0,
                False,
                attn_mask=mask,
                scale=1.0,
            )
        if far is not None:
            far.forward(q, k, v, table, out, log_sum_exp)
        ctx.prior_bias, ctx.far = prior_bias, far
        ctx.save_for_backward(q, k, v, table, out, log_sum_exp)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, table, out, log_sum_exp = ctx.saved_tensors
        far: FarRegion | None = ctx.far
        dtype = q.dtype
        # Half-precision inputs: the gradients are computed in the table's dtype and rounded once.
        q, k, v, grad_out, out = (t.to(table.dtype) for t in (q, k, v, grad_out, out))
        table_rev = (table if far is None else far.near(table)).flip(-1)
        if ctx.prior_bias:
            # With a far region, a row's keys span the bands and the far call: its weights come from
            # its whole log-sum-exp and delta from rowsum(dO O), as in FlashAttention.
            totals = None if far is None else (log_sum_exp, torch.linalg.vecdot(grad_out, out))
            with flushing_subnormals(q.device):
                dq, dk, dv, d_table_rev = table_backward(
                    ctx.bands(tile_rows(q.shape[2] if far is None else far.horizon, k.shape[2])),
                    grad_out,
                    q,
                    k,
                    v,
                    table_rev,
                    ctx.needs_input_grad[4],
                    totals,
                )
        else:
            dq, dk, dv = kernel_backward(
                ctx.bands(FLASH_ROWS), grad_out, q, k, v, table_rev, out, log_sum_exp
            )
            d_table_rev = None
        d_table = None if d_table_rev is None else d_table_rev.flip(-1)
        if far is not None:
            far.backward(grad_out, q, k, v, table, out, log_sum_exp, dq, dk, dv)
            if d_table is not None:  # each row's dS sums to 0: the far cells' sum is minus the near ones'
                d_table[:, far.index] -= d_table.sum(-1)
        return None, dq.to(dtype), dk.to(dtype), dv.to(dtype), d_table, None, None


@dataclass(frozen=True)
class FarRegion:
    """The lags at and beyond ``horizon``, where the table is constant, under plain causal masking.

    Query i and key j are ``i - j + shift`` apart (``shift = Lk - Lq``); the far region is the cells
    whose lag reaches the horizon: queries from ``first = horizon - shift`` on, each against the keys
    ``j <= i - first``, a causal triangle of ``Lq - first`` queries and as many keys. Its bias is one
    value per head, the table's entry ``index`` (at the horizon), which the kernel's softmax takes as
    a shift of the log-sum-exp: that region runs as plain causal SDPA, forward and backward. The rest,
    the near band of each row, runs through the table as before, its far lags hidden. The entry's
    gradient, the sum of ``dS = P (dP - delta)`` over the far cells, is minus that over the near
    ones, which the table's backward sums: a row's ``dS`` sums to 0 (the softmax's backward).
    """

    first: int  # the first query row that has far keys
    index: int  # the table's entry at the horizon
    horizon: int  # the lag where the region starts: each row's nearer keys are fewer

    def near(self, table: Tensor) -> Tensor:
        """The table with -inf from the horizon on: the bands' bias."""
        return table.index_fill(-1, torch.arange(self.index, table.shape[-1], device=table.device), -math.inf)

    def near_blocks(
        self, blocks: Callable[[int], tuple[tuple[slice, slice], ...]]
    ) -> Callable[[int], tuple[tuple[slice, slice], ...]]:
        """``blocks`` with each block's keys cut to those some row of it sees nearer than the horizon:
        keys after ``rows.start - first``."""

        def near_blocks(step: int) -> tuple[tuple[slice, slice], ...]:
            return tuple(
                (rows, slice(max(cols.start, rows.start - self.first + 1), cols.stop))
                for rows, cols in blocks(step)
            )

        return near_blocks

    def constant(self, table: Tensor) -> Tensor:
        """``(1, H or 1, 1)``: the far region's bias."""
        return table[:, self.index][None, :, None]

    def forward(self, q, k, v, table, out, log_sum_exp) -> None:
        """Join the far region's attention to the bands' ``out``, ``log_sum_exp`` in place (rows from
        ``first`` on, summed in the table's dtype)."""
        H, Lq = q.shape[1], q.shape[2]
        n = Lq - self.first
        far_out, far_lse = flash(
            q[:, :, self.first :],
            query_heads(k, H)[:, :, :n],
            query_heads(v, H)[:, :, :n],
            0.0,
            True,
            scale=1.0,
        )
        far_lse = far_lse + self.constant(table)
        near_lse = log_sum_exp[:, :, self.first :]
        total = torch.logaddexp(near_lse, far_lse)
        merged = (near_lse - total).exp()[..., None] * out[:, :, self.first :].to(table.dtype)
        merged += (far_lse - total).exp()[..., None] * far_out.to(table.dtype)
        out[:, :, self.first :] = merged
        log_sum_exp[:, :, self.first :] = total

    def backward(self, grad_out, q, k, v, table, out, log_sum_exp, dq, dk, dv) -> None:
        """Add the far region's ``dq, dk, dv``: the kernel's backward, its weights ``exp(S + c - lse)``
        with ``lse`` the rows' whole log-sum-exp, ``delta`` from their whole output. The triangle is
        taken in squares and rectangles of :data:`BACKWARD_KEYS` queries and keys (the kernel returns
        fresh gradients of the size of its inputs: whole, they took a T5 at L = 16384 to 1.19x plain
        SDPA's peak memory)."""
        H = q.shape[1]
        k_heads, v_heads = query_heads(k, H), query_heads(v, H)
        shifted = log_sum_exp - self.constant(table)
        for queries in cut(0, q.shape[2] - self.first, BACKWARD_KEYS):
            rows = slice(self.first + queries.start, self.first + queries.stop)
            # keys before the run's first query's are all seen (a rectangle), its own a causal square
            for keys in [*cut(0, queries.start, BACKWARD_KEYS), queries]:
                d_q, d_k, d_v = flash_backward(
                    grad_out[:, :, rows],
                    q[:, :, rows],
                    k_heads[:, :, keys],
                    v_heads[:, :, keys],
                    out[:, :, rows],
                    shifted[:, :, rows],
                    0.0,
                    keys == queries,
                    scale=1.0,
                )
                dq[:, :, rows] += d_q
                dk[:, :, keys] += key_heads(d_k, k.shape[1])
                dv[:, :, keys] += key_heads(d_v, k.shape[1])


def far_region(horizon: int | None, masking: Masking, Lq: int) -> FarRegion | None:
    """The :class:`FarRegion` of a table constant from lag ``horizon`` on (``Prior.constant_beyond``),
    or None: no horizon, masking other than plain causal, keys older than the horizon for the first
    query (a long cache before the queries: not one causal triangle), or a triangle shorter than
    :data:`FAR_SIDE` horizons."""
    if horizon is None or not masking.plain_causal:
        return None
    shift = masking.k_pos.shape[-1] - Lq
    first = horizon - shift
    if first < 0 or Lq - first < max(1, FAR_SIDE * horizon):
        return None
    return FarRegion(
        first=first, index=horizon + Lq - 1, horizon=horizon
    )  # i - j + Lk - 1 at lag i - j + shift


def kernel_backward(bands, grad_out, q, k, v, table_rev, out, log_sum_exp):
    """``dq, dk, dv`` from the kernel's own backward, band by band (:func:`weight_bands`), in runs of
    at most :data:`BACKWARD_KEYS` keys."""
    B, H, Lq, _ = q.shape
    k_heads, v_heads = query_heads(k, H), query_heads(v, H)
    dq, dk_heads, dv_heads = torch.zeros_like(q), torch.zeros_like(k_heads), torch.zeros_like(v_heads)
    for rows, heads, band in bands:
        for cols in cut(band.start, band.stop, BACKWARD_KEYS):
            dq_rev, dk_block, dv_block = flash_backward(
                grad_out[:, heads, rows].flip(2),
                q[:, heads, rows].flip(2),
                k_heads[:, heads, cols],
                v_heads[:, heads, cols],
                out[:, heads, rows].flip(2),
                log_sum_exp[:, heads, rows].flip(2),
                0.0,
                False,
                attn_mask=hankel_mask(table_rev, B, H, rows, cols, queries_reversed(rows, cols, Lq))[
                    :, heads
                ],
                scale=1.0,
            )
            dq[:, heads, rows] += dq_rev.flip(2)
            dk_heads[:, heads, cols] += dk_block
            dv_heads[:, heads, cols] += dv_block
    return dq, key_heads(dk_heads, k.shape[1]), key_heads(dv_heads, k.shape[1])


def smallest_log_weight(dtype: torch.dtype) -> float:
    """Log of the smallest weight whose key the bands keep (:func:`weight_bands`): ``sqrt(finfo.tiny)``.

    Smaller weights, and their products with the gradients, would be subnormal numbers, which x86
    cores compute about a hundred times slower (they made the table's backward 3x slower for GGD,
    before it flushed them). Next to a row's largest weight (at least ``1 / Lk``) such weights lie
    far below the dtype's resolution.
    """
    return 0.5 * math.log(torch.finfo(dtype).tiny)


Band = tuple[slice, slice, slice]  # query rows, a run of heads, the key columns those heads need


def content_reach(q: Tensor, k: Tensor) -> Tensor:
    """``(H, Lq)``: how far the content ``<q_i, k_j>`` can lift one key of row i above another,
    ``2 |q_i| max_j |k_j|`` (Cauchy-Schwarz), the largest over the batch."""
    H = q.shape[1]
    # Summed in float32 at least: the kernel takes half-precision inputs as they are.
    q_norm, k_norm = (
        torch.linalg.vector_norm(x, dim=-1, dtype=torch.promote_types(x.dtype, torch.float32)) for x in (q, k)
    )
    return 2 * q_norm.amax(0) * k_norm.amax(dim=(0, 2)).repeat_interleave(H // k.shape[1])[:, None]


def call_bands(
    blocks: Callable[[int], tuple[tuple[slice, slice], ...]], table: Tensor, q: Tensor, k: Tensor
) -> Callable[[int], list[Band]]:
    """``step -> bands`` of one call: its blocks of ``step`` rows narrowed to the keys each head needs
    (:func:`weight_bands`), or whole, every head at once, when the table is not steep."""
    H, cutoff = q.shape[1], smallest_log_weight(table.dtype)
    if not is_steep(table, cutoff):
        return lambda step: [(rows, slice(0, H), cols) for rows, cols in blocks(step)]
    reach = content_reach(q, k)
    return lambda step: weight_bands(blocks(step), table, reach, cutoff)


def is_steep(table: Tensor, cutoff: float) -> bool:
    """Whether the table's finite entries span more than ``-cutoff``. Otherwise no bias lies far
    enough below another for :func:`weight_bands` to leave a key out, and the norms it needs are not
    computed: a flat prior (GGD as it starts in training, none) takes whole blocks."""
    finite = table[table.isfinite()]
    return finite.numel() > 0 and float(finite.max() - finite.min()) > -cutoff


def weight_bands(
    blocks: tuple[tuple[slice, slice], ...], table: Tensor, reach: Tensor, cutoff: float
) -> list[Band]:
    """The ``blocks`` (query rows, key columns) narrowed per head to the keys whose weight can reach
    ``exp(cutoff)`` (:func:`smallest_log_weight`); heads in a row that need the same keys share a band.

    Row i's log-sum-exp is at least its largest logit, so key j's log-weight is at most
    ``table[t_ij] - best_i + reach_i``, with ``best_i`` the largest table entry the row sees and
    ``reach_i`` from :func:`content_reach`. Every row of a block reads the entries
    ``rows.stop - 1 .. rows.start + Lk - 1``, whose maximum bounds each ``best_i`` from below (or
    nothing: no narrowing). Beyond the lags where a steep prior falls that far, the keys are left
    out; which lags those are depends on the prior and on the inputs' norms.
    """
    Lk = table.shape[-1] - reach.shape[-1] + 1
    lowest = torch.finfo(table.dtype).min
    bands = []
    for rows, cols in blocks:
        seen_by_all = table[:, rows.stop - 1 : rows.start + Lk]
        best = seen_by_all.amax(-1) if seen_by_all.shape[-1] else table.new_full(table.shape[:1], lowest)
        floor = (best - reach[:, rows].amax(-1) + cutoff).clamp(min=lowest)  # (H,)
        # Row i reads table entries i .. i + Lk - 1; entry t is its key i + Lk - 1 - t.
        window = table[:, rows.start : rows.stop + Lk - 1]
        index = torch.arange(window.shape[-1], device=table.device)
        needed = window >= floor[:, None]  # (H, lq + Lk - 1)
        first = torch.where(needed, index, window.shape[-1]).amin(-1).tolist()
        last = torch.where(needed, index, -1).amax(-1).tolist()
        lq = rows.stop - rows.start
        keys = [
            (max(cols.start, Lk - 1 - hi), min(cols.stop, lq + Lk - 1 - lo)) for lo, hi in zip(first, last)
        ]
        for (c0, c1), heads in itertools.groupby(range(len(keys)), key=keys.__getitem__):
            heads = list(heads)
            if c1 > c0:
                bands.append((rows, slice(heads[0], heads[-1] + 1), slice(c0, c1)))
    return bands


def head_chunks(B: int, H: int, heads: slice, n: int) -> list[tuple[slice, slice]]:
    """``(batch rows, heads)`` slices covering ``B x heads`` in chunks of about ``n`` heads: whole
    batch rows when ``heads`` are all ``H`` and ``n`` covers them, else part of one row's ``heads``
    (so that :func:`merged` is a view)."""
    if heads == slice(0, H) and n >= H:
        return [(bs, heads) for bs in cut(0, B, n // H)]
    return [(slice(b, b + 1), hs) for b in range(B) for hs in cut(heads.start, heads.stop, n)]


def merged(x: Tensor, bs: slice, hs: slice, positions: slice) -> Tensor:
    """``x[bs, hs, positions]`` with its batch and head dims merged into one: a view, since a chunk
    of :func:`head_chunks` is one batch row or whole rows of heads."""
    return x[bs, hs, positions].flatten(0, 1)


def tile_rows(width: int, Lk: int) -> int:
    """Query rows per tile of the table's backward, for rows that see ``width`` keys of ``Lk``:
    ``width / 8`` between a quarter of :data:`TILE_ROWS` and all of it, where a causal tile's hidden
    triangle (about ``rows / (2 width)`` of its work) stays small, and at most ``TILE_BUFFER / Lk``.
    One thread: against 64 rows everywhere, 128 took GGD at L = 4096 from 1.14x plain SDPA's time to
    1.07x, and at L = 256 took 7% longer (docs/performance_log.md, `memeff` in the fifth session);
    against 128, 256 rows took KERPLE at L = 4096 from 1.58x to 1.47x (docs/benchmarks.md).
    At L = 16384 the buffer's bound keeps 128 rows: 256 would add 17 MB to the route's peak."""
    least = max(1, TILE_ROWS // 4)
    rows = min(TILE_ROWS, max(least, width // 8))
    return max(least, min(rows, TILE_BUFFER // max(Lk, 1)))


def table_backward(tiles, grad_out, q, k, v, table_rev, table_grad, totals=None):
    """``dq, dk, dv`` and the reversed table's gradient (None unless ``table_grad``), tile by tile.

    ``totals``: None when each row's band holds all its keys (its weights are the softmax over the
    band), else each row's log-sum-exp and ``delta = rowsum(dO O)`` ``(B, H, Lq)`` over all its keys.

    A tile is :func:`tile_rows` query rows (in reverse order) of a few heads of a band, and the keys
    the band needs (``tiles``, :func:`weight_bands`), at most :data:`TILE_CELLS` cells; its buffers
    are reused by every tile. Grouped keys and values are repeated per query head here (one copy each).
    """
    B, H, Lq, _ = q.shape
    Hkv, Lk = k.shape[1:3]
    k, v = query_heads(k, H), query_heads(v, H)
    # Contiguous whatever the inputs' strides: dk and dv are summed into through merged(), whose
    # flatten is a view only of a contiguous tensor (of a layer's transposed projections it would be a
    # copy, and the sums would be lost).
    dq, dk, dv = (torch.zeros_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))
    d_table_rev = torch.zeros_like(table_rev) if table_grad else None
    empty = empty_rows(table_rev.flip(-1), Lk)
    shared = table_rev.shape[0] == 1  # one table row for every head
    chunk = [
        min(B * (h.stop - h.start), max(1, TILE_CELLS // ((r.stop - r.start) * (c.stop - c.start))))
        for r, h, c in tiles
    ]
    cells = max(
        (
            n * (r.stop - r.start) * (c.stop - c.start + r.stop - r.start)
            for n, (r, _, c) in zip(chunk, tiles)
        ),
        default=0,
    )
    weights_buffer, grads_buffer = q.new_empty(cells), q.new_empty(cells)
    for n, (rows, heads, cols) in zip(chunk, tiles):
        lq, lk = rows.stop - rows.start, cols.stop - cols.start
        start = queries_reversed(rows, cols, Lq)  # the reversed table's index of the tile's cell (0, 0)
        for bs, hs in head_chunks(B, H, heads, n):
            shape = (bs.stop - bs.start, hs.stop - hs.start, lq, lk)
            G = shape[0] * shape[1]
            # Both buffers hold rows of lk cells and lq of padding: the softmax and its backward run
            # in place on whole (contiguous) rows, whose padding gets weight 0 and gradient 0, and
            # the gradient's padding serves shifted_row_sums.
            scores = weights_buffer[: G * lq * (lk + lq)].view(G, lq, lk + lq)
            padded = grads_buffer[: G * lq * (lk + lq)].view(G, lq, lk + lq)
            probs, d_probs = scores[..., :lk], padded[..., :lk]  # logits, then weights; dP, then dS
            scores[..., lk:].fill_(-math.inf)
            padded[..., lk:].zero_()
            q_tile, d_out = merged(q, bs, hs, rows).flip(1), merged(grad_out, bs, hs, rows).flip(1)
            k_tile, v_tile = merged(k, bs, hs, cols), merged(v, bs, hs, cols)
            # P: the softmax over the band's keys, as the kernel took it (they agree to rounding:
            # the keys a band leaves out have weights below sqrt(finfo.tiny)). One fused pass each
            # way, where exp(S - lse) took eight; and a row whose weight sits on one key has exactly
            # 1 there, the others exactly 0.
            torch.bmm(q_tile, k_tile.mT, out=probs)
            probs.view(shape).add_(hankel_mask(table_rev, shape[0], H, rows, cols, start)[:, hs])
            if totals is None:
                softmax_(scores)
            else:
                scores.sub_(merged(totals[0], bs, hs, rows)[..., None].flip(1)).exp_()
            if empty is not None:  # NaN above (every logit -inf), padding included
                hidden = empty[slice(None) if shared else hs, rows, None].flip(1)
                scores.view(*shape[:3], -1).masked_fill_(hidden, 0.0)
            merged(dv, bs, hs, cols).baddbmm_(probs.mT, d_out)
            torch.bmm(d_out, v_tile.mT, out=d_probs)
            # dS = P (dP - delta), delta = rowsum(P dP) from the tile's own weights, so that a row
            # with one weight of exactly 1 gets dS = 0 exactly (BlockwiseAttention.backward).
            if totals is None:
                softmax_backward_(padded, scores)
            else:
                padded.sub_(merged(totals[1], bs, hs, rows)[..., None].flip(1)).mul_(scores)
            d_logits = d_probs
            dq[bs, hs, rows] = (d_logits @ k_tile).view(*shape[:3], -1).flip(2)
            merged(dk, bs, hs, cols).baddbmm_(d_logits.mT, q_tile)
            if table_grad:
                d_lags = shifted_row_sums(padded).view(*shape[:2], -1).sum(0)  # (heads, lq + lk - 1)
                if shared:
                    d_lags = d_lags.sum(0, keepdim=True)
                d_table_rev[slice(None) if shared else hs, start : start + d_lags.shape[-1]] += d_lags
    return dq, key_heads(dk, Hkv), key_heads(dv, Hkv), d_table_rev


def lag_flash_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    table: Tensor | None,
    masking: Masking,
    blocks: Callable[[int], tuple[tuple[slice, slice], ...]],
    dtype: torch.dtype,
    horizon: int | None = None,
) -> Tensor:
    """Attention ``(B, H, Lq, Dv)`` of scaled ``q`` with bias ``table[i - j + Lk - 1]`` (None: no bias)
    under masks on lags only; ``blocks(step)`` are query rows in runs of ``step`` and the keys they
    see (``memeff.key_blocks``). ``dtype``: of the table and the sums (float32 for half-precision
    ``q, k, v``, which the kernel takes as they are). ``horizon``: a lag from which on the bias is
    the table's value at that lag (``Prior.constant_beyond``), or None; under plain causal masking
    those cells run as plain causal SDPA (:class:`FarRegion`), and the table's entries beyond the
    horizon are not read (their gradient is 0, the horizon's holds the whole region's)."""
    far = None if table is None else far_region(horizon, masking, q.shape[2])
    return LagTableFlash.apply(blocks, q, k, v, masked_table(table, masking, dtype), table is not None, far)
