"""How the routes consume a prior: folded into q/k lanes, as a lag table, or as dense tiles.

Folding (seed 000 Eq. 20-24) turns a prior's :class:`~priorattn.priors.FoldLanes` into q/k inputs.

With ``q' = [scale * q, q_lanes]`` and ``k' = [k, k_lanes]``, ``<q', k'> = scale <q, k> + <lanes>``:
the log-prior enters unscaled and no ``Lq x Lk`` bias exists. Key-only terms are two more lanes in
SDPA, ``<1, u_h(j)>`` and ``<m_h, k_pos[j] - centre>``, or one broadcast row per block in the
blockwise route. SSMax multiplies row i of ``q'`` by ``s_h log n_i`` (the lanes too when it scales the prior).

The op's ``key_bias`` (data, not a prior: FoX's ``-F_j``) joins the prior's key-only terms. A key bias
may drift without bound along the keys (FoX's cumulative log forget gates), so every route adds it
re-centred on the keys a run of queries sees (:func:`centred_key_bias`), and sizes those runs as it
sizes them for a slope of the key bias's mean drift per key (:func:`key_bias_drift`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..priors import FoldLanes, Prior, ScaledLag
from ..priors.base import sum_of_present
from .masks import Masking, values_are_free

#: Largest magnitude the centred slope term may reach within one call, per dtype: past it, rounding
#: of ``m * (k_pos - centre)`` shows in the logits (benchmarks/fold_precision.py measures it).
SLOPE_MAGNITUDE = {
    torch.float64: 2.0**30,
    torch.float32: 2.0**8,
    torch.bfloat16: 2.0**0,
    torch.float16: 2.0**2,
}


#: A folded SDPA call should cover at least this many queries (or all of them): shorter runs of
#: queries would each be a separate, small kernel call.
MIN_FOLD_SPAN = 256


def largest_slope(slope: Tensor | None, bound: float) -> float:
    """``max |slope|``, read where that is free (:func:`~.masks.values_are_free`), else ``bound``:
    the prior's :meth:`~priorattn.priors.Prior.slope_bound`, known without a read. On an accelerator
    a read waits for its queue to drain, and under ``torch.compile`` it breaks the graph; the CPU
    reads it, and a gentle slope then takes longer runs of queries."""
    if slope is None or not slope.numel():
        return 0.0
    return float(slope.detach().abs().max()) if values_are_free(slope) else bound


def slope_span(largest: float, dtype: torch.dtype) -> int | None:
    """Longest run of queries one call may cover with a slope of magnitude up to ``largest``
    centred on them; None: no limit."""
    if largest == 0.0:
        return None
    span = SLOPE_MAGNITUDE.get(dtype, SLOPE_MAGNITUDE[torch.float32]) / largest
    return None if span > 2**62 else max(1, int(span))  # a subnormal slope: inf, and no limit


#: Integers up to this magnitude are exact in a half-precision dtype (2^significand bits).
EXACT_INTEGERS = {torch.bfloat16: 2**8, torch.float16: 2**11}


def position_spread(masking: Masking) -> int | None:
    """``max - min`` over the call's query and key positions, or None where reading them costs a
    host read that is not free (:func:`~.masks.values_are_free`): it bounds every ``k_pos - centre``."""
    Lq, Lk = masking.q_pos.shape[-1], masking.k_pos.shape[-1]
    if masking.starts is not None:
        q0, k0 = masking.starts
        return max(q0 + Lq, k0 + Lk) - 1 - min(q0, k0)
    if not values_are_free(masking.q_pos) or not Lq or not Lk:
        return None
    low = min(int(masking.q_pos.min()), int(masking.k_pos.min()))
    return max(int(masking.q_pos.max()), int(masking.k_pos.max())) - low


def slope_precision(dtype: torch.dtype, masking: Masking, key_bias: Tensor | None = None) -> torch.dtype:
    """The dtype whose :data:`SLOPE_MAGNITUDE` bounds a folded slope's runs of queries in ``dtype``.

    The SDPA kernels sum the logits in float32 whatever their inputs (tested for the CPU flash
    kernel, tests/functional/test_half_precision_fold.py; CUDA's flash and memory-efficient kernels
    accumulate in float32 by design, not measured here). A half-precision slope
    lane holds ``m_h`` (rounded once, as every half-precision lane) times ``k_pos - centre``, an
    integer: exact in the dtype while the call's positions spread over at most
    :data:`EXACT_INTEGERS`, and then the lane rounds no more than float32's does (the tiny model's
    256 positions in bfloat16). Beyond it the offsets round too, and ``dtype``'s own bound holds, as it
    does beside a ``key_bias``, whose lane holds reals, not integers.
    """
    limit = EXACT_INTEGERS.get(dtype)
    if limit is None or key_bias is not None:
        return dtype
    spread = position_spread(masking)
    return torch.float32 if spread is not None and spread <= limit else dtype


def fold_dtype(
    largest: float, dtype: torch.dtype, masking: Masking, key_bias: Tensor | None = None
) -> torch.dtype:
    """The dtype a folded SDPA call computes in: ``dtype``, or float32 for half-precision inputs whose
    slope (of magnitude up to ``largest``, :func:`largest_slope`) would need runs of fewer than
    ``min(Lq, MIN_FOLD_SPAN)`` queries (a bfloat16 lane whose key offsets round as well allows runs
    within ``|m (j - c)| <= 1``, see :func:`slope_precision`; ``largest`` includes a ``key_bias``'s
    drift, :func:`key_bias_drift`)."""
    Lq = masking.q_pos.shape[-1]
    span = slope_span(largest, slope_precision(dtype, masking, key_bias))
    if span is None or span >= min(Lq, MIN_FOLD_SPAN) or dtype not in (torch.bfloat16, torch.float16):
        return dtype
    return torch.float32


def key_bias_drift(key_bias: Tensor | None) -> Tensor | None:
    """``(H or 1,)``: the mean ``|u[j+1] - u[j]|`` of a key bias ``u`` ``(B or 1, H or 1, Lk)`` over
    neighbouring keys, the largest over batch rows; None without a key bias or with one key.

    Routes size runs of queries as for a slope of this magnitude (:func:`slope_span`): over a run of
    ``s`` keys the centred bias then moves by about ``s`` times it, as a slope's term does (FoX's
    ``-F_j`` climbs by ``-log f_j`` per key: Lin et al. 2025, Sec. 2)."""
    if key_bias is None or key_bias.shape[-1] < 2:
        return None
    u = key_bias.detach()
    return (u[..., 1:] - u[..., :-1]).abs().mean(-1).amax(0)


def key_rates(slope: Tensor | None, drift: Tensor | None) -> Tensor | None:
    """What sizes a fold's runs of queries per head: ``|slope|`` plus a key bias's drift, ``(H or 1,)``
    (None: neither)."""
    if drift is None:
        return slope
    return drift if slope is None else slope.detach().abs() + drift


def centred_key_bias(key_bias: Tensor, cols: slice, dtype: torch.dtype) -> Tensor:
    """``key_bias[..., cols]`` less its largest value over those keys (per batch row and head), in
    ``dtype``: the same constant for every query of a run leaves its softmax as it was, and the keys
    near those queries then hold small numbers however far the bias has drifted. The centre is taken
    in the key bias's own dtype (FoX hands float64) and carries no gradient (its gradient is zero)."""
    u = key_bias[..., cols]
    if not u.shape[-1]:
        return u.to(dtype)
    return (u - u.detach().amax(-1, keepdim=True)).to(dtype)


def with_key_bias(lanes: FoldLanes, key_bias: Tensor | None) -> FoldLanes:
    """``lanes`` with the op's ``key_bias`` added to their key-only terms."""
    if key_bias is None:
        return lanes
    total = key_bias if lanes.key_bias is None else lanes.key_bias + key_bias
    return lanes._replace(key_bias=total)


def content_queries(q: Tensor, scale: float, factor: Tensor | None) -> Tensor:
    """``scale * q`` (times the SSMax factor), in the dtype of ``q``."""
    return q * scale if factor is None else (q * scale * factor).to(q.dtype)


def prior_factor(q: Tensor, prior: Prior | None, factor: Tensor | None, scale_prior: bool) -> Tensor | None:
    """Query i's factor on the prior's terms, ``(B or 1, H, Lq, 1)``: the SSMax ``factor`` where SSMax
    scales the prior, times the prior's query gate of the content queries ``q``
    (:meth:`~priorattn.priors.Prior.query_gate`, GOAT's query-norm gate); None for 1."""
    gate = None if prior is None else prior.query_gate(q)
    ssmax = factor if scale_prior else None
    if gate is None or ssmax is None:
        return ssmax if gate is None else gate
    return gate * ssmax


def query_lanes(q: Tensor, q_lanes: Tensor, row_factor: Tensor | None) -> Tensor:
    """The fold's q lanes ``(.., H, lq, P)`` of ``q``'s rows, as ``(B, H, lq, P)`` in ``q``'s dtype;
    times the prior's row factor (:func:`prior_factor`) where there is one."""
    if row_factor is not None:
        q_lanes = q_lanes * row_factor
    B, H, lq = q.shape[:3]
    return q_lanes.to(q.dtype).expand(B, H, lq, q_lanes.shape[-1])


def fold_at(prior: Prior, masking: Masking) -> FoldLanes:
    """``prior.fold`` at the call's positions. Where the queries and keys hold the same run of
    positions (self-attention without a cache) it passes one tensor for both, so that a prior may
    compute what the two share once (:meth:`~priorattn.priors.Prior.fold`: GOAT's phases)."""
    q_pos, k_pos = masking.q_pos, masking.k_pos
    if masking.starts is not None and masking.starts[0] == masking.starts[1] and q_pos.shape == k_pos.shape:
        q_pos = k_pos
    return prior.fold(q_pos, k_pos)


def lane_inputs(
    q: Tensor,
    k: Tensor,
    lanes: FoldLanes,
    scale: float,
    factor: Tensor | None,
    row_factor: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """``[scale * q, q_lanes]`` and ``[k, k_lanes]``, in the dtype of ``q``; the content times the
    SSMax ``factor``, the lanes times the prior's ``row_factor`` (:func:`prior_factor`)."""
    content = content_queries(q, scale, factor)
    if lanes.q.shape[-1] == 0:  # key terms only (ALiBi): no lanes to append, no copies
        return content, k
    k_lanes = lanes.k.to(k.dtype).expand(k.shape[0], k.shape[1], *lanes.k.shape[-2:])
    q_lanes = query_lanes(q, lanes.q, row_factor)
    return torch.cat([content, q_lanes], dim=-1), torch.cat([k, k_lanes], dim=-1)


def centred_keys(masking: Masking, rows: slice, cols: slice, dtype: torch.dtype) -> Tensor:
    """``k_pos[j] - centre`` ``(B or 1, lk)``, centred on the last query of ``rows``: the slope lane."""
    centre = masking.q_pos[:, rows].amax(dim=-1, keepdim=True)
    return (masking.k_pos[:, cols] - centre).to(dtype)


def tabulates(prior: Prior, masking: Masking) -> bool:
    """Whether :func:`lag_table` has a table for this call: a relative prior on known position runs."""
    return prior.is_relative and masking.starts is not None


def lag_table(prior: Prior, masking: Masking) -> Tensor | None:
    """``K_h(d)`` for every lag ``d = q_pos - k_pos`` of the call, ``(H or 1, Lq + Lk - 1)``, or None.

    Index ``i - j + Lk - 1`` holds the lag of query i and key j. Only for relative priors on
    positions that are one run shared by the batch: the prior is then evaluated ``Lq + Lk - 1``
    times instead of ``Lq * Lk``.
    """
    if not tabulates(prior, masking):
        return None
    return prior.lag_values(call_lags(masking)).contiguous()


def call_lags(masking: Masking) -> Tensor:
    """Every lag of a call on position runs, ``(Lq + Lk - 1,)``: index ``i - j + Lk - 1`` holds the
    lag of query i and key j."""
    q0, k0 = masking.starts
    Lq, Lk = masking.q_pos.shape[-1], masking.k_pos.shape[-1]
    first = q0 - (k0 + Lk - 1)
    return torch.arange(first, first + Lq + Lk - 1, device=masking.q_pos.device)


def interpolates(prior: Prior, masking: Masking) -> bool:
    """Whether :func:`scaled_lag` has the prior's grid for this call: a prior of a scaled lag
    (FIRE), causal, on position runs with keys from position 0 on, where its argument stays in
    ``[0, 1]``."""
    return prior.is_scaled_lag and masking.causal and masking.starts is not None and masking.starts[1] >= 0


def scaled_lag(prior: Prior, masking: Masking, cells: int) -> ScaledLag:
    """The prior as a function of a scaled lag (:meth:`~priorattn.priors.Prior.scaled_lag`) for this
    call, sampled at ``cells + 1`` points, its lag scale indexed as :func:`lag_table`'s (``i - j +
    Lk - 1``); only where :func:`interpolates`."""
    return prior.scaled_lag(call_lags(masking), masking.q_pos[0], cells)  # one run: starts[0] + arange


@dataclass
class PriorInputs:
    """One call's inputs for the blockwise routes: logits are ``<q, k>`` plus the prior's rest.

    ``q`` is the content times ``scale`` (and the SSMax factor) with the fold's q lanes; ``k`` the
    content with the fold's k lanes. Of the prior's remaining terms at most these are set:
    ``key_bias`` ``(B or 1, H or 1, Lk)`` (a fold's and the op's) and ``slope`` ``(H,)`` from a fold,
    or a lag ``table``, or ``dense`` (the prior itself, evaluated on tiles); the op's key bias may
    come with a table or a dense prior too.
    """

    q: Tensor
    k: Tensor
    key_bias: Tensor | None = None
    slope: Tensor | None = None
    table: Tensor | None = None
    dense: Prior | None = None


def split_prior(
    q: Tensor,
    k: Tensor,
    prior: Prior | None,
    masking: Masking,
    scale: float,
    factor: Tensor | None,
    row_factor: Tensor | None,
    key_bias: Tensor | None = None,
) -> PriorInputs:
    """Fold the prior where it folds, else tabulate it by lag, else leave it dense; the op's
    ``key_bias`` joins the key-only terms, kept in its own dtype where that is wider than ``q``'s
    (it is centred before it is rounded: :func:`centred_key_bias`)."""
    if key_bias is not None:
        key_bias = key_bias.to(torch.promote_types(key_bias.dtype, q.dtype))
    if prior is not None and prior.can_fold(masking.causal):
        lanes = fold_at(prior, masking)
        q2, k2 = lane_inputs(q, k, lanes, scale, factor, row_factor)
        own = None if lanes.key_bias is None else lanes.key_bias.to(q.dtype)
        slope = None if lanes.slope is None else lanes.slope.to(q.dtype)
        return PriorInputs(q2, k2, key_bias=sum_of_present([own, key_bias]), slope=slope)
    content = PriorInputs(q * scale if factor is None else q * scale * factor, k, key_bias=key_bias)
    if prior is not None:
        table = lag_table(prior, masking)
        if table is not None:
            content.table = table.to(q.dtype)
        else:
            content.dense = prior
    return content
