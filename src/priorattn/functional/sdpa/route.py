"""The SDPA route, :func:`sdpa_attention`: batch rows in groups of one key-span layout, the prior
folded into q/k lanes, the calls planned (:mod:`.planning`) and run through the CPU flash kernel
(:class:`~.flash.FoldedCalls`) or, on other devices and under ``torch.compile``, through public SDPA
with autograd (:func:`autograd_calls`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ...priors import FoldLanes, Prior
from ...ssmax import Scaling
from ..masks import Masking
from ..prior_inputs import (
    fold_at,
    fold_dtype,
    key_bias_drift,
    key_rates,
    largest_slope,
    prior_factor,
    slope_precision,
    with_key_bias,
)
from ..spans import Call, Kind, batch_groups, key_spans, select_rows, visible_counts
from .flash import LowerRightCausal, folded_calls
from .fold import Fold, lanes_of, with_row_balance
from .planning import Plans, head_plans, heads_per_thread_team, weight_bands


def sdpa_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    prior: Prior | None,
    masking: Masking,
    scale: float,
    ssmax: Scaling | None,
    key_bias: Tensor | None = None,
) -> Tensor:
    """Prior attention through the SDPA kernel: one unmodified call unless chunks are needed.

    Batch rows whose key spans (document boundaries) or padding differ run as separate groups.
    ``key_bias`` ``(B or 1, H or 1, Lk)`` is one more lane (``<1, u[b, h, j]>``), re-centred on each
    call's keys (:func:`~..prior_inputs.centred_key_bias`), and its gradient takes one more, zero in
    value, that makes each query row's share of it sum to zero (:func:`~.fold.with_row_balance`).
    """
    if prior is not None and not prior.can_fold(masking.causal):
        raise ValueError(
            f"backend='sdpa' needs a prior that folds into q/k lanes; {type(prior).__name__} does not"
            f"{' without a causal mask' if not masking.causal else ''}: use backend='memeff'"
        )
    spans = None
    if masking.masks_anything and not masking.plain_causal:
        spans = key_spans(masking)
    groups = None if spans is None else batch_groups(masking, *spans)
    if groups is None:
        return folded_attention(q, k, v, prior, masking, spans, scale, ssmax, key_bias)
    # One gather into group order, then views per group: indexing q, k, v once per group would
    # cost the backward a zero-filled whole-batch gradient per group.
    order, sizes = torch.cat(groups), [len(index) for index in groups]
    qs, ks, vs = (t[order].split(sizes) for t in (q, k, v))
    outputs = []
    for index, q_g, k_g, v_g in zip(groups, qs, ks, vs):
        lo, hi = (t if t.shape[0] == 1 else t[index] for t in spans)
        group = select_rows(masking, index)
        bias = key_bias if key_bias is None or key_bias.shape[0] == 1 else key_bias[index]
        outputs.append(folded_attention(q_g, k_g, v_g, prior, group, (lo, hi), scale, ssmax, bias))
    return torch.cat(outputs)[order.argsort()]


def folded_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    prior: Prior | None,
    masking: Masking,
    spans: tuple[Tensor, Tensor] | None,
    scale: float,
    ssmax: Scaling | None,
    key_bias: Tensor | None = None,
) -> Tensor:
    """The prior (and ``key_bias``) folded into q/k lanes, through the calls of
    :func:`~.planning.plan_calls`; rows that see no key return zeros."""
    counts = visible_counts(masking, spans) if ssmax is not None else None
    factor = None if counts is None else ssmax.factor(counts)  # (B or 1, H, Lq, 1)
    row_factor = prior_factor(q, prior, factor, ssmax is not None and ssmax.scale_prior)
    dtype, bound = q.dtype, 0.0 if prior is None else prior.slope_bound()
    if prior is None:
        lanes = FoldLanes(q.new_zeros(1, q.shape[2], 0), q.new_zeros(1, k.shape[2], 0))
    else:
        lanes = fold_at(prior, masking)
    # A key bias sizes runs of queries as a slope of its drift per key would.
    rates = key_rates(lanes.slope, key_bias_drift(key_bias))
    lanes = with_key_bias(lanes, key_bias)
    if (
        prior is not None or key_bias is not None
    ):  # half precision computes in float32 rather than in tiny runs
        compute = fold_dtype(largest_slope(rates, bound), dtype, masking, key_bias)
        q, k, v = q.to(compute), k.to(compute), v.to(compute)
    # No prior: the calls take q, k, v as they are, and autograd saves no copies.
    run_calls = autograd_calls if prior is None and key_bias is None else folded_calls_kernel(q.device)
    precision = slope_precision(q.dtype, masking, key_bias)
    H = q.shape[1]
    chunk, bands = H, None
    if run_calls is folded_calls:
        chunk = heads_per_thread_team(q.shape[0], torch.get_num_threads())
        bands = weight_bands(q, k, lanes, scale, masking, factor, row_factor)
    plans = head_plans(masking, spans, rates, bound, precision, H, chunk, bands)
    if key_bias is not None:  # after the bands: the lane adds nothing to a logit
        lanes = with_row_balance(lanes, key_bias, q.shape[2])
    width = max(q.shape[-1] + lanes.width, v.shape[-1])
    fold = Fold(masking, scale, H, width, centred_bias=key_bias is not None)
    return run_calls(fold, plans, q, k, v, lanes, factor, row_factor).to(dtype)


def folded_calls_kernel(device: torch.device) -> Callable[..., Tensor]:
    """How a prior's calls run: through the CPU flash kernel's forward and backward where they exist
    (the CPU, eagerly), else with autograd through public SDPA (other devices, and ``torch.compile``,
    which traces public operators and finds no thread state to keep)."""
    if device.type == "cpu" and not torch.compiler.is_compiling():
        return folded_calls
    return autograd_calls


def autograd_calls(
    fold: Fold,
    plans: Plans,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    lanes: FoldLanes,
    factor: Tensor | None,
    row_factor: Tensor | None,
) -> Tensor:
    """The calls through public SDPA with autograd (any device): the backward keeps every call's
    ``q'``, ``k'``, ``v'``. Every head takes the same calls (``plans`` has one entry)."""
    [(_, calls)] = plans
    B, H, Lq, Dv = *q.shape[:3], v.shape[-1]
    queries = Runs(q, [bound for c in calls for bound in (c.rows.start, c.rows.stop)])
    keys = Runs(k, [bound for c in calls for bound in (c.cols.start, c.cols.stop)])
    values = Runs(v, keys.bounds)
    # Queries no call covers see no key and return zeros; taken from q's graph (a sum over no
    # lanes), so the output keeps a gradient (of zero) even when no query sees a key.
    unseen = q[..., :0].sum(-1, keepdim=True).expand(B, H, Lq, Dv)
    outputs, done = [], 0
    for call in calls:
        rows, cols = call.rows, call.cols
        if rows.start > done:
            outputs.append(unseen[:, :, done : rows.start])
        call_lanes = lanes_of(lanes, rows, cols)
        factors = (None if f is None else f[..., rows, :] for f in (factor, row_factor))
        q2 = fold.queries(queries[rows], call_lanes, *factors)
        k2, v2 = fold.keys(keys[cols], values[cols], call_lanes, rows, cols)
        outputs.append(attend(q2, k2, v2, call)[..., :Dv])
        done = rows.stop
    if done < Lq:
        outputs.append(unseen[:, :, done:])
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)


def attend(q2: Tensor, k2: Tensor, v2: Tensor, call: Call) -> Tensor:
    """One call of the SDPA kernel on folded inputs (scale 1), masked as ``call`` says."""
    gqa = q2.shape[1] != k2.shape[1]
    if call.kind is Kind.FULL:
        return F.scaled_dot_product_attention(q2, k2, v2, scale=1.0, enable_gqa=gqa)
    if call.kind is Kind.CAUSAL:
        if k2.shape[2] == q2.shape[2]:
            return F.scaled_dot_product_attention(q2, k2, v2, is_causal=True, scale=1.0, enable_gqa=gqa)
        if gqa:
            group = q2.shape[1] // k2.shape[1]
            k2, v2 = k2.repeat_interleave(group, dim=1), v2.repeat_interleave(group, dim=1)
        return lower_right_kernel(q2.device)(q2, k2, v2)
    out = F.scaled_dot_product_attention(q2, k2, v2, attn_mask=call.mask, scale=1.0, enable_gqa=gqa)
    return torch.where(call.mask.any(dim=-1, keepdim=True), out, 0.0)


class Runs:
    """``t`` ``(B, heads, L, D)`` cut at the given bounds, read back one call's run at a time.

    Slicing the whole tensor for each call would cost the backward a zero-filled gradient of the
    whole tensor per call (O(L^2 / band) for a window's bands); the pieces of one ``split`` get
    theirs in one concatenation. A run is a piece, or a short ``cat`` of the pieces it spans.
    """

    def __init__(self, t: Tensor, bounds: list[int]):
        self.bounds = sorted({0, t.shape[2], *bounds})
        # One piece is t itself: a split into one piece would copy its gradient back in the backward.
        sizes = [b - a for a, b in zip(self.bounds, self.bounds[1:])]
        self.pieces = t.split(sizes, dim=2) if len(sizes) > 1 else (t,)
        self.first = {bound: i for i, bound in enumerate(self.bounds)}

    def __getitem__(self, run: slice) -> Tensor:
        i, j = self.first[run.start], self.first[run.stop]
        return self.pieces[i] if j == i + 1 else torch.cat(self.pieces[i:j], dim=2)


def lower_right_kernel(device: torch.device) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    """Bottom-right causal attention for ``device``: the CPU flash kernel exists only on the CPU."""
    return LowerRightCausal.apply if device.type == "cpu" else public_lower_right_causal


def public_lower_right_causal(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """:class:`~.flash.LowerRightCausal` with public operators only (any device): SDPA with torch's
    bottom-right causal bias, which CUDA runs in its flash or memory-efficient kernels without a
    mask (the CPU materialises one, so the CPU uses :class:`~.flash.LowerRightCausal`). ``torch.compile``
    cannot trace that bias (a tensor subclass built in the graph): there the mask is a boolean
    ``(Lq, Lk)`` tensor, a call's queries against its keys."""
    if torch.compiler.is_compiling():
        Lq, Lk = q.shape[2], k.shape[2]
        mask = torch.ones(Lq, Lk, dtype=torch.bool, device=q.device).tril_(Lk - Lq)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)
    # Imported here: the module pulls in torch._dynamo (about 1 s and 70 MB at import), which CPU
    # runs, taking the CPU kernel, never need.
    from torch.nn.attention.bias import causal_lower_right

    bias = causal_lower_right(q.shape[2], k.shape[2])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=1.0)
