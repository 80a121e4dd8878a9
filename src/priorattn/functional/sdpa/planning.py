"""Query-run planning of the SDPA route: the kernel calls of one batch group (:func:`plan_calls`:
runs of queries, each against only the keys it can see), per run of heads as long as their slopes
allow (:func:`head_plans`), and the keys a steep slope gives no weight (:func:`slope_bands`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ...priors import FoldLanes
from ..lag_flash import smallest_log_weight
from ..masks import Masking
from ..prior_inputs import (
    largest_slope,
    slope_span,
)
from ..spans import Call, Kind, cut, span_calls

#: Largest number of (query, key) cells of a boolean mask handed to SDPA in one call.
MASK_CHUNK_CELLS = 1 << 22


#: Most queries one call of a banded head takes (:func:`slope_bands`): each costs the kernel half its
#: run in its causal square besides its band.
BAND_RUN = 1024


#: Key-sorted query runs of one batch group, per run of heads: ``[(heads, calls), ...]``.
Plans = list[tuple[slice, list[Call]]]


def plan_calls(
    masking: Masking, spans: tuple[Tensor, Tensor] | None, step: int | None, band: int | None = None
) -> list[Call]:
    """The kernel calls of one batch group, in query order, each covering at most ``step`` queries.

    ``spans`` are the group's key spans (rows identical across the group), or None: then plain
    causal masking and no masking need no data, and anything else takes dense masks in chunks.
    ``band`` (plain causal masking only, :func:`slope_bands`): a call leaves out the keys more than
    ``band`` before its first query's own key.
    """
    Lq, Lk = masking.q_pos.shape[-1], masking.k_pos.shape[-1]
    if not masking.masks_anything:
        return [Call(rows, slice(0, Lk), Kind.FULL) for rows in cut(0, Lq, step)]
    if masking.plain_causal and Lq <= Lk:  # key index <= query index + (Lk - Lq)
        past, band = Lk - Lq, Lk if band is None else band
        # A single query sees every key of its call: one unmasked call, not a causal split into
        # two (a NoPE decode step of the tiny model: 1.18x faster at a cache of 1k, 1.13x at 4k).
        return [
            Call(rows, slice(max(0, past + rows.start - band), past + rows.stop), kind_of(rows))
            for rows in cut(0, Lq, step)
        ]
    if spans is None:
        chunk = min(step or Lq, max(1, MASK_CHUNK_CELLS // max(Lk, 1)))
        return [Call(rows, slice(0, Lk), Kind.MASKED, masking.visible(rows)) for rows in cut(0, Lq, chunk)]
    lo, hi = spans
    padding = None if masking.key_padding is None else masking.key_padding[0]
    return span_calls(lo[0], hi[0], padding, masking.window, step, MASK_CHUNK_CELLS)


def kind_of(rows: slice) -> Kind:
    """How a plain causal call of query ``rows`` masks its keys (bottom-right aligned)."""
    return Kind.CAUSAL if rows.stop - rows.start > 1 else Kind.FULL


def heads_per_thread_team(batch: int, threads: int) -> int:
    """Fewest consecutive heads whose calls keep each of ``threads`` busy in the flash kernel's
    backward, which gives each (batch row, head) of a call to one thread: ``threads / gcd(batch,
    threads)``. Alone, ALiBi's or GOAT's steepest head ran its backward on one of two threads, which
    on two busy cores took 29x the time per cell of two heads' (docs/performance_log.md)."""
    return threads // math.gcd(batch, threads)


def head_plans(
    masking: Masking,
    spans: tuple[Tensor, Tensor] | None,
    slope: Tensor | None,
    bound: float,
    precision: torch.dtype,
    heads: int,
    chunk: int,
    bands: list[int | None] | None = None,
) -> Plans:
    """The calls of :func:`plan_calls` for runs of consecutive heads, each run of queries as long as
    the steepest slope among the heads allows (:func:`~..prior_inputs.slope_span`; ``bound``: the
    prior's :meth:`~priorattn.priors.Prior.slope_bound`, taken where the slope is not free to read).
    Heads come in chunks of ``chunk`` (the last may be shorter) that take their calls together:
    chunks whose slopes allow different runs take their own calls (ALiBi's and GOAT's gentler heads
    then need few or one); ``chunk = heads``: every head takes the steepest head's. ``bands`` (per
    head, :func:`slope_bands`): a chunk whose heads all have one leaves out the keys beyond the
    widest, in runs of at most :data:`BAND_RUN` queries, where that leaves out more than a tenth of
    its cells."""
    Lq = masking.q_pos.shape[-1]
    if slope is None or slope.shape[0] != heads:
        step = slope_span(largest_slope(slope, bound), precision)
        return [(slice(0, heads), plan_calls(masking, spans, step))]
    groups = []  # [first head, step, band] of each run of heads with one plan
    for h in range(0, heads, chunk):
        step = slope_span(largest_slope(slope[h : h + chunk], bound), precision)
        step = None if step is None or step >= Lq else step  # one run: no limit
        band = None if bands is None else widest(bands[h : h + chunk])
        if band is not None:
            banded = min(step or BAND_RUN, BAND_RUN)
            full, narrow = (cells(plan_calls(masking, spans, *plan)) for plan in ((step,), (banded, band)))
            step, band = (banded, band) if narrow < 0.9 * full else (step, None)
        if not groups or groups[-1][1:] != (step, band):
            groups.append((h, step, band))
    bounds = [h for h, *_ in groups] + [heads]
    return [(slice(a, b), plan_calls(masking, spans, *plan)) for (a, *plan), b in zip(groups, bounds[1:])]


def widest(bands: list[int | None]) -> int | None:
    """The widest of some heads' bands; None if one of them has none."""
    return None if None in bands else max(bands)


def cells(calls: list[Call]) -> int:
    """(query, key) cells the kernel computes for ``calls``: half of a causal call's square."""
    total = 0
    for call in calls:
        lq, lk = call.rows.stop - call.rows.start, call.cols.stop - call.cols.start
        total += lq * lk - (lq * (lq - 1) // 2 if call.kind is Kind.CAUSAL else 0)
    return total


def slope_bands(
    q: Tensor,
    k: Tensor,
    lanes: FoldLanes,
    scale: float,
    masking: Masking,
    factor: Tensor | None = None,
    row_factor: Tensor | None = None,
) -> list[int | None] | None:
    """Per head, how many keys before a query's own key can carry weight, or None (no limit).

    Under plain causal masking query i sees its own key ``i + Lk - Lq``; a key ``d`` positions
    before it has a logit ``r_i m_h d`` lower from a slope ``m_h > 0`` (ALiBi, GOAT's recency term,
    seed 000 App. F.3) times query i's ``row_factor`` ``r_i`` (:func:`~..prior_inputs.prior_factor`:
    GOAT's query gate, SSMax scaling the prior; 1 without one), and at most ``reach_h`` higher from
    every other lane (:func:`lane_reach`, the content times the SSMax ``factor``), while the row's
    log-sum-exp is at least its own key's logit. Beyond ``d = (reach_h - cutoff) / (m_h min_i r_i)``,
    with ``cutoff`` the log of float32's (or float64's) ``sqrt(finfo.tiny)``
    (:func:`~..lag_flash.smallest_log_weight`, as the ``memeff`` route's weight bands), a key's weight
    lies below ``sqrt(tiny)`` of the row's: far below the dtype's resolution, and zero in the
    kernel, which flushes subnormal numbers (``subnormals.py``). Leaving those keys out is exact
    to the dtype, and a steep head then costs ``O(L / m_h)``, not ``O(L^2)``. A head whose row
    factor reaches 0 has no band."""
    slope, (Lq, Lk) = lanes.slope, (q.shape[2], k.shape[2])
    # Up to BAND_RUN queries are one run, whose causal square leaves nothing out.
    if slope is None or slope.shape[0] != q.shape[1] or not masking.plain_causal or not BAND_RUN < Lq <= Lk:
        return None
    # Half precision too: the kernel sums in float32, and float16's own sqrt(tiny) is 2^-7.
    cutoff = smallest_log_weight(torch.promote_types(q.dtype, torch.float32))
    rates = slope.detach().double()  # (H,): the slope of each head's flattest row
    if row_factor is not None:
        rates = rates * row_factor.detach().double().amin(dim=(0, 2, 3))
    steepest = float(rates.max())
    if not steepest > 0 or -cutoff / steepest >= Lk:  # no band short of every key
        return None
    widths = (lane_reach(q, k, lanes, scale, factor, row_factor) - cutoff) / rates
    return [int(w) + 1 if 0 < w < Lk else None for w in widths.tolist()]


@torch.no_grad()
def lane_reach(
    q: Tensor,
    k: Tensor,
    lanes: FoldLanes,
    scale: float,
    factor: Tensor | None = None,
    row_factor: Tensor | None = None,
) -> Tensor:
    """``(H,)`` float64: how far the logit without its slope term (``<q', k'>`` over every other lane
    of :class:`~.fold.Fold`: content times the SSMax ``factor``, fold lanes and key bias times the
    prior's ``row_factor``) can lift one key of a row above another, ``2 max_i |q'_i| max_j |k'_j|``
    (Cauchy-Schwarz) over the batch; the norms of the parts bound those of the whole. A thousandth
    more covers the rounding of the norms."""
    H, Hkv = q.shape[1], k.shape[1]
    queries = scale**2 * largest_square(q, factor) + largest_square(lanes.q, row_factor)
    keys = largest_square(k).repeat_interleave(H // Hkv) + largest_square(lanes.k)
    if lanes.key_bias is not None:  # <1, u_h(j)>: the query's lane is 1 times its row factor
        queries = queries + (1 if row_factor is None else largest_square(row_factor))
        keys = keys + largest_square(lanes.key_bias[..., None])
    return 2.002 * (queries * keys).sqrt()


def largest_square(t: Tensor, rows: Tensor | None = None) -> Tensor:
    """``(heads or 1,)`` float64: the largest squared norm of ``t``'s rows ``(..., heads or 1, L, D)``
    per head (dim -3; without one, a single value), each row times ``rows`` ``(.., heads or 1, L, 1)``
    where given."""
    norms = torch.linalg.vector_norm(t, dim=-1, dtype=torch.promote_types(t.dtype, torch.float32))
    if rows is not None:
        norms = norms * rows[..., 0].abs()
    heads = norms.shape[-2] if norms.dim() > 1 else 1
    return norms.amax(-1).reshape(-1, heads).amax(0).double().square()
