"""Query-run planning of the SDPA route: the kernel calls of one batch group (:func:`plan_calls`:
runs of queries, each against only the keys it can see), per run of heads as long as their slopes
allow (:func:`head_plans`), and the keys a prior's key terms give no weight (:func:`weight_bands`).
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


#: Most queries one call of a banded head takes (:func:`weight_bands`): each costs the kernel half its
#: run in its causal square besides its band.
BAND_RUN = 1024


#: Key-sorted query runs of one batch group, per run of heads: ``[(heads, calls), ...]``.
Plans = list[tuple[slice, list[Call]]]


def plan_calls(
    masking: Masking, spans: tuple[Tensor, Tensor] | None, step: int | None, first: list[int] | None = None
) -> list[Call]:
    """The kernel calls of one batch group, in query order, each covering at most ``step`` queries.

    ``spans`` are the group's key spans (rows identical across the group), or None: then plain
    causal masking and no masking need no data, and anything else takes dense masks in chunks.
    ``first`` (plain causal masking only, :func:`weight_bands`): the first key each query needs; a
    call leaves out the keys before the smallest of its queries'.
    """
    Lq, Lk = masking.q_pos.shape[-1], masking.k_pos.shape[-1]
    if not masking.masks_anything:
        return [Call(rows, slice(0, Lk), Kind.FULL) for rows in cut(0, Lq, step)]
    if masking.plain_causal and Lq <= Lk:  # key index <= query index + (Lk - Lq)
        past = Lk - Lq
        # A single query sees every key of its call: one unmasked call, not a causal split into
        # two (a NoPE decode step of the tiny model: 1.18x faster at a cache of 1k, 1.13x at 4k).
        return [
            Call(rows, slice(0 if first is None else min(first[rows]), past + rows.stop), kind_of(rows))
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
    bands: Tensor | None = None,
) -> Plans:
    """The calls of :func:`plan_calls` for runs of consecutive heads, each run of queries as long as
    the steepest slope among the heads allows (:func:`~..prior_inputs.slope_span`; ``bound``: the
    prior's :meth:`~priorattn.priors.Prior.slope_bound`, taken where the slope is not free to read).
    Heads come in chunks of ``chunk`` (the last may be shorter) that take their calls together:
    chunks whose slopes allow different runs take their own calls (ALiBi's and GOAT's gentler heads
    then need few or one); ``chunk = heads``: every head takes the steepest head's. ``bands``
    (:func:`weight_bands`): a chunk leaves out the keys before the first one any of its heads needs,
    in runs of at most :data:`BAND_RUN` queries, where that leaves out more than a tenth of its
    cells; consecutive chunks with bands take one plan where that costs little more
    (:func:`shared_band`)."""
    Lq = masking.q_pos.shape[-1]
    per_head = slope is not None and slope.shape[0] == heads
    if not per_head and bands is None:
        step = slope_span(largest_slope(slope, bound), precision)
        return [(slice(0, heads), plan_calls(masking, spans, step))]
    groups = []  # [first head, step, first keys] of each run of heads with one plan
    for h in range(0, heads, chunk):
        step = slope_span(largest_slope(slope[h : h + chunk] if per_head else slope, bound), precision)
        step = None if step is None or step >= Lq else step  # one run: no limit
        first = None if bands is None else bands[h : h + chunk].amin(0).tolist()
        if first is not None:
            banded = min(step or BAND_RUN, BAND_RUN)
            full, narrow = (cells(plan_calls(masking, spans, *plan)) for plan in ((step,), (banded, first)))
            step, first = (banded, first) if narrow < 0.9 * full else (step, None)
        if groups and groups[-1][1] == step and groups[-1][2] != first:
            shared = shared_band(masking, spans, step, (h - groups[-1][0], groups[-1][2]), (chunk, first))
            if shared is not None:  # the calls of both chunks at once: half the kernel calls
                groups[-1][2] = shared
                continue
        if not groups or groups[-1][1:] != [step, first]:
            groups.append([h, step, first])
    bounds = [h for h, *_ in groups] + [heads]
    return [(slice(a, b), plan_calls(masking, spans, *plan)) for (a, *plan), b in zip(groups, bounds[1:])]


def shared_band(
    masking: Masking, spans: tuple[Tensor, Tensor] | None, step: int, *chunks: tuple[int, list[int] | None]
) -> list[int] | None:
    """The first keys that ``chunks`` of heads (``(heads, first keys)``, :func:`weight_bands`) of one
    run length can take together: each query's smallest, where that costs at most a tenth more cells
    than each chunk's own; None where it costs more or a chunk has no band. FoX's heads often forget
    at similar rates, and on busy cores each kernel call (and each step around it) also waits for
    the thread the scheduler took away: one plan for its four heads took 1.79x plain SDPA's wall
    time at L = 4096 on two shared cores where two plans took 2.55x (docs/benchmarks.md)."""
    if any(first is None for _, first in chunks):
        return None
    shared = [min(keys) for keys in zip(*(first for _, first in chunks))]
    own = sum(n * cells(plan_calls(masking, spans, step, first)) for n, first in chunks)
    together = sum(n for n, _ in chunks) * cells(plan_calls(masking, spans, step, shared))
    return shared if together <= 1.1 * own else None


def cells(calls: list[Call]) -> int:
    """(query, key) cells the kernel computes for ``calls``: half of a causal call's square."""
    total = 0
    for call in calls:
        lq, lk = call.rows.stop - call.rows.start, call.cols.stop - call.cols.start
        total += lq * lk - (lq * (lq - 1) // 2 if call.kind is Kind.CAUSAL else 0)
    return total


def weight_bands(
    q: Tensor,
    k: Tensor,
    lanes: FoldLanes,
    scale: float,
    masking: Masking,
    factor: Tensor | None = None,
    row_factor: Tensor | None = None,
) -> Tensor | None:
    """``(H, Lq)`` int64: per head, the first key each query needs, every key before it carrying no
    weight; None where no query leaves a key out.

    Under plain causal masking query i sees its own key ``o_i = i + Lk - Lq``. The prior's key terms
    give key j ``r_i w_h(j)`` with ``w_h(j) = m_h k_pos[j] + u_h(j)``: a slope ``m_h`` (ALiBi,
    GOAT's recency term, seed 000 App. F.3) and the key bias lane ``u_h`` (GOAT's sink, the op's
    ``key_bias``: FoX's ``-F_j``, Lin et al. 2025 Sec. 2), times query i's ``row_factor`` ``r_i``
    (:func:`~..prior_inputs.prior_factor`: GOAT's query gate, SSMax scaling the prior; 1 without
    one). Every other lane lifts one key at most ``reach_h`` above another (:func:`lane_reach`, the
    content times the SSMax ``factor``), and the row's log-sum-exp is at least its own key's logit.
    So a key with ``w_h(o_i) - w_h(j) > (reach_h - cutoff) / min_i r_i`` weighs less than
    ``exp(cutoff)`` of the row, ``cutoff`` the log of float32's (or float64's) ``sqrt(finfo.tiny)``
    (:func:`~..lag_flash.smallest_log_weight`, as the ``memeff`` route's weight bands): far below the
    dtype's resolution, and zero in the kernel, which flushes subnormal numbers (``subnormals.py``).
    The keys left out are those before the first whose running maximum of ``w_h`` reaches
    ``w_h(o_i) - (reach_h - cutoff) / min_i r_i`` (taken over the batch rows), so a bias that climbs
    and falls again keeps every key its climb could lift. Leaving them out is exact to the dtype, and
    a steep slope or a fast-forgetting FoX head then costs ``O(L / m_h)``, not ``O(L^2)``. A head
    whose row factor reaches 0 leaves no key out."""
    Lq, Lk = q.shape[2], k.shape[2]
    # Up to BAND_RUN queries are one run, whose causal square leaves nothing out.
    if lanes.slope is None and lanes.key_bias is None or not masking.plain_causal or not BAND_RUN < Lq <= Lk:
        return None
    # Half precision too: the kernel sums in float32, and float16's own sqrt(tiny) is 2^-7.
    cutoff = smallest_log_weight(torch.promote_types(q.dtype, torch.float32))
    H = q.shape[1]
    w = torch.zeros(1, H, Lk, dtype=torch.float64)  # (B or 1, H, Lk): w_h(j)
    if lanes.slope is not None:
        w = w + lanes.slope.detach().double()[:, None] * masking.k_pos.double()[:, None, :]
    if lanes.key_bias is not None:
        w = w + lanes.key_bias.detach().double()
    floor = torch.ones(H, dtype=torch.float64)  # (H,): each head's smallest row factor
    if row_factor is not None:
        floor = row_factor.detach().double().amin(dim=(0, 2, 3)).expand(H)
    reach = lane_reach(q, k, lanes, scale, factor, row_factor)
    drop = torch.where(floor > 0, (reach - cutoff) / floor, torch.inf)  # (H,)
    running = w.cummax(-1).values
    first = torch.searchsorted(running, (w[..., Lk - Lq :] - drop[:, None]).contiguous())
    first = first.amin(0)  # (H, Lq): the keys before it weigh nothing in every batch row
    return first if first.any() else None


@torch.no_grad()
def lane_reach(
    q: Tensor,
    k: Tensor,
    lanes: FoldLanes,
    scale: float,
    factor: Tensor | None = None,
    row_factor: Tensor | None = None,
) -> Tensor:
    """``(H,)`` float64: how far the logit without its key terms (``<q', k'>`` over the content times
    the SSMax ``factor`` and the fold's lanes times the prior's ``row_factor``, :class:`~.fold.Fold`;
    not the slope and key bias lanes) can lift one key of a row above another, ``2 max_i |q'_i| max_j |k'_j|``
    (Cauchy-Schwarz) over the batch; the norms of the parts bound those of the whole. A thousandth
    more covers the rounding of the norms."""
    H, Hkv = q.shape[1], k.shape[1]
    queries = scale**2 * largest_square(q, factor) + largest_square(lanes.q, row_factor)
    keys = largest_square(k).repeat_interleave(H // Hkv) + largest_square(lanes.k)
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
