"""The SDPA route: fold the prior into extra q/k lanes and call unmodified SDPA.

Seed 000 Eq. 20-24 / Algorithm 1: ``q' = [scale * q, q_lanes, 1]``, ``k' = [k, k_lanes, key terms]``
and SDPA runs with its own scale set to 1, so the log-prior enters unscaled and no ``Lq x Lk`` bias
is ever built. Queries run in chunks only where needed, each against only the keys its queries can
see (``spans.py``: one mask-free call per document of a packed row, bands of queries under a
sliding window); a boolean mask is handed to SDPA only where no mask-free kernel fits, a few
million cells at a time, and a key-linear slope is re-centred on each chunk's queries.

On the CPU a prior's calls run through the flash kernel's own forward and backward
(:class:`FoldedCalls`): each pass builds ``q'`` and ``k'`` of all queries and keys once and
re-centres only the slope lane of ``k'`` in place before each call, so a slope re-centred on every
run of queries costs O(L) memory, not a ``k'`` per run (at L = 16384, 1.73x-1.87x plain SDPA's
peak memory before, 1.04x-1.07x after: docs/performance_log.md); heads whose slopes allow longer runs
take fewer calls (:func:`head_plans`), in chunks of heads that keep every thread busy; a steep
slope's heads leave out the keys it gives no weight (:func:`slope_bands`); and the kernel calls run
where float32 subnormals flush to zero (``subnormals.py``), which made the route 2-7x plain SDPA's
time under a slope.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..priors import FoldLanes, Prior
from ..ssmax import Scaling
from .grouped import grouped, grouped_scores, grouped_values
from .lag_flash import smallest_log_weight
from .masks import Masking
from .prior_inputs import (
    centred_keys,
    content_queries,
    fold_dtype,
    largest_slope,
    query_lanes,
    slope_precision,
    slope_span,
)
from .reference import compute_dtype
from .spans import Call, Kind, batch_groups, cut, key_spans, select_rows, span_calls, visible_counts
from .subnormals import flushing_subnormals

#: Largest number of (query, key) cells of a boolean mask handed to SDPA in one call.
MASK_CHUNK_CELLS = 1 << 22
#: Most keys one kernel call of a folded route takes; longer calls merge blocks by log-sum-exp, so
#: the kernel's backward returns the gradients of no more keys than this at a time.
KEY_BLOCK = 4096
#: Most queries one call of a banded head takes (:func:`slope_bands`): each costs the kernel half its
#: run in its causal square besides its band.
BAND_RUN = 1024
#: A decode step has at most this many queries (see :func:`sdpa_bias_attention`).
DECODE_QUERIES = 16
#: Largest bias tile ``B * H * Lq * Lk`` a decode step builds (64 MB in float32).
BIAS_TILE_CELLS = 1 << 24


@dataclass(frozen=True)
class Fold:
    """What turns one call's q, k, v and lanes into SDPA's inputs of ``heads`` heads and ``width``
    lanes (seed 000 Eq. 20-24): ``q' = [scale * q, q_lanes, 1, m_h]``, ``k' = [k, k_lanes, u_h(j),
    k_pos[j] - centre]`` (the last two lanes for a key bias and a slope), ``v`` padded to ``width``."""

    masking: Masking
    scale: float
    scale_prior: bool
    heads: int
    width: int

    def queries(self, q: Tensor, lanes: FoldLanes, factor: Tensor | None) -> Tensor:
        """``q'`` of one call: ``q``, ``lanes.q`` and ``factor`` hold its query rows."""
        content = content_queries(q, self.scale, factor)
        B, H, lq = q.shape[:3]
        q_lanes = [lanes.q.expand(B, H, lq, lanes.q.shape[-1])]
        if lanes.key_bias is not None:  # <1, u_h(j)>
            q_lanes.append(lanes.q.new_ones(1, 1, 1, 1).expand(B, H, lq, 1))
        if lanes.slope is not None:  # <m_h, k_pos[j] - centre>
            q_lanes.append(lanes.slope[:, None, None].to(lanes.q.dtype).expand(B, H, lq, 1))
        if len(q_lanes) == 1 and not lanes.q.shape[-1]:
            return content
        q_lanes = torch.cat(q_lanes, dim=-1)
        return torch.cat([content, query_lanes(q, q_lanes, factor, self.scale_prior)], dim=-1)

    def keys(self, k: Tensor, v: Tensor, lanes: FoldLanes, rows: slice, cols: slice) -> tuple[Tensor, Tensor]:
        """``k'`` and the padded ``v`` of query ``rows`` against key ``cols``: ``k``, ``v``, ``lanes.k``
        and ``lanes.key_bias`` hold those columns. A key bias is per head: the keys take every head."""
        if lanes.key_bias is not None and k.shape[1] != self.heads:
            group = self.heads // k.shape[1]
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        B, Hk, lk = k.shape[:3]
        k_lanes = [lanes.k.to(k.dtype).expand(B, Hk, lk, lanes.k.shape[-1])]
        if lanes.key_bias is not None:
            k_lanes.append(lanes.key_bias[..., None].to(k.dtype).expand(B, Hk, lk, 1))
        if lanes.slope is not None:
            offset = centred_keys(self.masking, rows, cols, k.dtype)  # (B or 1, lk)
            k_lanes.append(offset[:, None, :, None].expand(B, Hk, lk, 1))
        if len(k_lanes) > 1 or lanes.k.shape[-1]:
            k = torch.cat([k, *k_lanes], dim=-1)
        return k, v if v.shape[-1] == self.width else F.pad(v, (0, self.width - v.shape[-1]))


class LowerRightCausal(torch.autograd.Function):
    """Causal attention of the last ``Lq`` positions over ``Lk`` keys (SDPA scale 1), without a mask.

    Query i sees keys ``0 .. Lk - Lq + i``: an unmasked block over the ``Lk - Lq`` older keys plus a
    square causal block over the newest ``Lq``, each one call of the SDPA CPU kernel, merged by their
    log-sum-exp. The backward runs the kernel's own backward on each block with the merged output
    and log-sum-exp, which is exactly the softmax gradient restricted to that block's keys.
    The kernel wants one head width for q, k and v: the narrower side is padded with zero lanes.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        Dk, Dv = q.shape[-1], v.shape[-1]
        width = max(Dk, Dv)
        q, k, v = (t if t.shape[-1] == width else F.pad(t, (0, width - t.shape[-1])) for t in (q, k, v))
        past = k.shape[2] - q.shape[2]
        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        out, lse = flash(q, k[:, :, past:], v[:, :, past:], 0.0, True, scale=1.0)
        if past:
            out_old, lse_old = flash(q, k[:, :, :past], v[:, :, :past], 0.0, False, scale=1.0)
            total = torch.logaddexp(lse, lse_old)  # (B, H, Lq), float32
            out = out * (lse - total).exp()[..., None] + out_old * (lse_old - total).exp()[..., None]
            out, lse = out.to(q.dtype), total
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.widths = Dk, Dv
        return out[..., :Dv]

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        Dk, Dv = ctx.widths
        grad_out = F.pad(grad_out, (0, v.shape[-1] - Dv)).contiguous()
        past = k.shape[2] - q.shape[2]
        backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
        dq, dk, dv = backward(grad_out, q, k[:, :, past:], v[:, :, past:], out, lse, 0.0, True, scale=1.0)
        if past:
            dq_old, dk_old, dv_old = backward(
                grad_out, q, k[:, :, :past], v[:, :, :past], out, lse, 0.0, False, scale=1.0
            )
            dq, dk, dv = dq + dq_old, torch.cat([dk_old, dk], dim=2), torch.cat([dv_old, dv], dim=2)
        return dq[..., :Dk], dk[..., :Dk], dv[..., :Dv]


@dataclass(frozen=True)
class Block:
    """Keys ``cols`` of one call, taken by one kernel call: all visible, causal (a square block
    over the call's newest keys), or through a boolean ``mask`` ``(B or 1, 1, lq, lk)``."""

    cols: slice
    causal: bool = False
    mask: Tensor | None = None

    def bias(self, dtype: torch.dtype) -> Tensor | None:
        """The mask as the additive bias the flash kernel takes."""
        if self.mask is None:
            return None
        return torch.zeros(self.mask.shape, dtype=dtype, device=self.mask.device).masked_fill_(
            ~self.mask, -torch.inf
        )


def key_blocks(call: Call) -> list[Block]:
    """``call``'s keys in blocks of at most KEY_BLOCK (a masked call's keys are one block)."""
    start, stop = call.cols.start, call.cols.stop
    if call.kind is Kind.MASKED:
        return [Block(call.cols, mask=call.mask)]
    if call.kind is Kind.FULL:
        return [Block(cols) for cols in cut(start, stop, KEY_BLOCK)]
    newest = stop - (call.rows.stop - call.rows.start)  # bottom-right causal: older keys, then a square
    return [*(Block(cols) for cols in cut(start, newest, KEY_BLOCK)), Block(slice(newest, stop), causal=True)]


def merge(a: tuple[Tensor, Tensor], b: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """Softmax outputs and log-sum-exps of the same queries over two sets of keys, as one."""
    (out_a, lse_a), (out_b, lse_b) = a, b
    lse = torch.logaddexp(lse_a, lse_b)
    return out_a * (lse_a - lse).exp()[..., None] + out_b * (lse_b - lse).exp()[..., None], lse


def to_width(t: Tensor, width: int) -> Tensor:
    """``t`` with zero lanes up to ``width``: the flash kernel wants one head width for q, k, v."""
    return t if t.shape[-1] == width else F.pad(t, (0, width - t.shape[-1]))


def every_head(k: Tensor, heads: int) -> Tensor:
    """Grouped keys or values repeated to ``heads`` heads: the flash kernel wants as many as q."""
    return k if k.shape[1] == heads else k.repeat_interleave(heads // k.shape[1], 1)


def lanes_of(lanes: FoldLanes, rows: slice, cols: slice) -> FoldLanes:
    """The lanes of query ``rows`` and key ``cols`` (views)."""
    key_bias = None if lanes.key_bias is None else lanes.key_bias[..., cols]
    return FoldLanes(lanes.q[..., rows, :], lanes.k[..., cols, :], key_bias, lanes.slope)


class FoldedCalls(torch.autograd.Function):
    """The calls of one batch group through the CPU flash kernel, on ``q'``, ``k'``, ``v'`` of all the
    queries and keys, which :func:`flash_inputs` builds once per pass, outside: autograd carries their
    gradients back to q, k, v and the lanes, so learnable priors train.

    Autograd through the calls keeps every call's ``q'``, ``k'``, ``v'`` for the backward; with a
    slope, every run of queries has keys of its own centre, ``O(L^2 / run)`` lanes in all (1.7x-1.9x
    plain SDPA's peak memory at L = 16384, docs/performance_log.md). Here the forward keeps ``q'``,
    ``k'``, ``v'`` once, the output and its log-sum-exp, as plain SDPA keeps its inputs, and before
    each call re-centres only the slope lane of ``k'`` in place (:func:`recentre`): a per-call
    rebuild of the lanes was 10-20% of the route's time, and rebuilding ``q'``, ``k'``, ``v'`` in the
    backward (to carry their gradients back by a graph of its own) a quarter of the route's time
    beyond the kernel's at the tiny model's shape (docs/performance_log.md, fifth session). The backward runs
    the kernel's own backward on each block of keys (with the merged output and log-sum-exp that is
    exactly the softmax gradient restricted to those keys, as in :class:`LowerRightCausal`). One call
    over every head and row takes the kernel's results as they are, forward and backward. Otherwise
    the gradients of ``q'``, ``k'`` (and of a ``v'`` that is not ``v`` itself) are summed into their
    own places, which no call reads again once their run of heads is done (a graph kept for a second
    backward then finds them changed, and autograd says so): holding whole sums of the gradients of
    ``k'`` and ``v'`` beside them took ALiBi to 1.21x plain SDPA's peak memory at L = 16384, one run
    of heads' sums at a time 1.06x-1.07x (GOAT 1.13x -> 1.04x-1.07x; ``benchmarks/attention.py
    --one``). Both passes run with subnormals flushed (``subnormals.py``).
    """

    @staticmethod
    def forward(ctx, fold: Fold, plans: Plans, layout: Layout, q2: Tensor, k2: Tensor, v2: Tensor):
        with flushing_subnormals(q2.device):
            out, lse = folded_forward(fold, plans, layout, (q2, k2, v2))
        ctx.save_for_backward(q2, k2, v2, out, lse)
        ctx.fold, ctx.plans, ctx.layout = fold, plans, layout
        return out if out.shape[-1] == layout.values else out[..., : layout.values]

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        q2, k2, v2, out, lse = ctx.saved_tensors
        with flushing_subnormals(grad_out.device):
            grads = folded_backward(ctx.fold, ctx.plans, ctx.layout, [q2, k2, v2], (out, lse, grad_out))
        needed = ctx.needs_input_grad[3:]
        return None, None, None, *(grad if need else None for grad, need in zip(grads, needed))


@dataclass(frozen=True)
class Layout:
    """What :class:`FoldedCalls` needs to know of :func:`flash_inputs`' results: the index of the
    slope lane in ``k'`` (None: no slope), the values' own width, and whether ``k'`` and ``v'`` are
    ``k`` and ``v`` themselves (no lane to add or pad), which the backward must not write into."""

    slope_lane: int | None
    values: int
    shared: tuple[bool, bool]

    @classmethod
    def of(cls, k: Tensor, v: Tensor, lanes: FoldLanes, k2: Tensor, v2: Tensor) -> Layout:
        """The layout of ``k2``, ``v2``: :func:`flash_inputs` of ``k``, ``v`` and ``lanes``."""
        lane = None if lanes.slope is None else k.shape[-1] + lanes.k.shape[-1] + (lanes.key_bias is not None)
        return cls(lane, v.shape[-1], (k2 is k, v2 is v))


#: Key-sorted query runs of one batch group, per run of heads: ``[(heads, calls), ...]``.
Plans = list[tuple[slice, list[Call]]]


def only_call(plans: Plans, Lq: int) -> Call | None:
    """The call, where one call covers every head and all ``Lq`` rows (its results need no place)."""
    if len(plans) != 1 or len(plans[0][1]) != 1:
        return None
    call = plans[0][1][0]
    return call if (call.rows.start, call.rows.stop) == (0, Lq) else None


@torch.no_grad()
def folded_forward(
    fold: Fold, plans: Plans, layout: Layout, inputs: tuple[Tensor, Tensor, Tensor]
) -> tuple[Tensor, Tensor]:
    """:class:`FoldedCalls`' output, ``width`` lanes wide, and its log-sum-exp; zeros in the rows
    no call reads. One call over every head and row returns the kernel's output as it is."""
    q2, k2, v2 = inputs
    lse_dtype = torch.promote_types(q2.dtype, torch.float32)
    call = only_call(plans, q2.shape[2])
    if call is not None:  # the slope lane is centred on every query already (flash_inputs)
        out, lse = flash_call(q2, k2, v2, call)
        return out.to(q2.dtype), lse.to(lse_dtype)
    out, lse = torch.zeros_like(q2), q2.new_zeros(q2.shape[:3], dtype=lse_dtype)
    for heads, calls in plans:
        for call in calls:
            recentre(fold, k2[:, heads], layout, call)
            out[:, heads, call.rows], lse[:, heads, call.rows] = flash_call(
                q2[:, heads], k2[:, heads], v2[:, heads], call
            )
    return out, lse


def flash_call(q2: Tensor, k2: Tensor, v2: Tensor, call: Call) -> tuple[Tensor, Tensor]:
    """The output and log-sum-exp of ``call``'s queries: the kernel on each block of its keys, merged."""
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    q_call, merged = q2[:, :, call.rows], None
    for block in key_blocks(call):
        k_block, v_block, mask = k2[:, :, block.cols], v2[:, :, block.cols], block.bias(q2.dtype)
        part = flash(q_call, k_block, v_block, 0.0, block.causal, attn_mask=mask, scale=1.0)
        merged = part if merged is None else merge(merged, part)
    return merged


def zero_gaps(t: Tensor, heads: slice, calls: list[Call]) -> None:
    """Zero the rows of ``t[:, heads]`` (dim 2) that none of ``calls`` (in query order) reads."""
    done = 0
    for call in calls:
        t[:, heads, done : call.rows.start] = 0.0
        done = call.rows.stop
    t[:, heads, done:] = 0.0


def folded_backward(
    fold: Fold,
    plans: Plans,
    layout: Layout,
    inputs: list[Tensor],
    forward: tuple[Tensor, Tensor, Tensor],
) -> list[Tensor]:
    """The gradients of ``q'``, ``k'``, ``v'`` (``inputs``): the kernel's own backward on each call's
    blocks; ``forward`` is the output, its log-sum-exp and the output's gradient."""
    if len(plans) == 1:  # one run of every head: its gradients need no place of their own
        heads, calls = plans[0]
        return heads_backward(fold, calls, layout, inputs, forward, heads)
    q2, k2, v2 = inputs
    grads = [q2, *(t.clone() if shared else t for t, shared in zip((k2, v2), layout.shared))]
    for heads, calls in plans:
        places = [t[:, heads] for t in grads]
        run_grads = heads_backward(fold, calls, layout, places, forward, heads)
        for place, grad in zip(places, run_grads):
            if grad is not place:  # a later run must not find this run's sums beside k', v'
                place.copy_(grad)
    return grads


def heads_backward(
    fold: Fold,
    calls: list[Call],
    layout: Layout,
    inputs: list[Tensor],
    forward: tuple[Tensor, Tensor, Tensor],
    heads: slice,
) -> list[Tensor]:
    """The gradients of ``q'``, ``k'``, ``v'`` of ``heads`` (``inputs``), from the kernel's backward on
    the ``calls`` of ``heads``; ``forward`` is the output, log-sum-exp and output gradient of all
    heads. Each call's gradient of ``q'`` takes the place of its rows of ``q'``, which no other call
    reads, unless one call covers every row: then it is returned as the kernel gave it, as are the
    summed gradients of ``k'`` and ``v'``. The caller copies those into ``k'`` and ``v'`` where
    another run of heads follows (no later run reads these heads), so only one run's sums are held
    beside ``k'`` and ``v'``; ``inputs[2]`` is only read."""
    flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
    q2, k2, v2 = inputs
    out, lse, grad_out = (t[:, heads] for t in forward)
    one = only_call([(heads, calls)], q2.shape[2]) is not None
    if not one:
        zero_gaps(q2, slice(None), calls)
    sums = [None, None]  # of the gradients of k2 and v2
    for call in calls:
        if not one:  # one call: the slope lane is centred on every query already (flash_inputs)
            recentre(fold, k2, layout, call)
        rows = call.rows
        g = to_width(grad_out[:, :, rows], fold.width).contiguous()
        o, l = out[:, :, rows], lse[:, :, rows]
        dq_call = None
        for block in key_blocks(call):
            k_block, v_block, mask = k2[:, :, block.cols], v2[:, :, block.cols], block.bias(q2.dtype)
            dq, dk, dv = flash_backward(
                g, q2[:, :, rows], k_block, v_block, o, l, 0.0, block.causal, attn_mask=mask, scale=1.0
            )
            dq_call = dq if dq_call is None else dq_call + dq
            for i, (like, grad) in enumerate(zip((k2, v2), (dk, dv))):
                sums[i] = add_at(sums[i], like, grad, (slice(None), slice(None), block.cols))
        if one:
            q2 = dq_call
        else:
            q2[:, :, rows] = dq_call
    return [q2] + [torch.zeros_like(like) if total is None else total for like, total in zip((k2, v2), sums)]


def add_at(total: Tensor | None, like: Tensor, grad: Tensor, index: tuple[slice, ...]) -> Tensor:
    """``total`` (None: zeros shaped as ``like``) plus ``grad`` at ``[index]``; a first ``grad`` that
    covers all of ``like`` (one kernel call over every query and key of its heads) is taken as it is."""
    if total is None and grad.shape == like.shape:
        return grad
    total = torch.zeros_like(like) if total is None else total
    total[index] += grad
    return total


def flash_inputs(
    fold: Fold, q: Tensor, k: Tensor, v: Tensor, lanes: FoldLanes, factor: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """``q'`` of every query and ``k'``, ``v'`` of every key as the flash kernel takes them: ``width``
    lanes, one head per query head, the slope lane centred on the last query (:func:`recentre`
    centres it on each call's queries)."""
    q2 = to_width(fold.queries(q, lanes, factor), fold.width)
    k2, v2 = fold.keys(k, v, lanes, slice(0, q.shape[2]), slice(0, k.shape[2]))
    return q2, every_head(to_width(k2, fold.width), fold.heads), every_head(v2, fold.heads)


def recentre(fold: Fold, k2: Tensor, layout: Layout, call: Call) -> None:
    """Centre the slope lane of ``k2`` (:func:`flash_inputs`) on ``call``'s queries, in place."""
    if layout.slope_lane is not None:
        offsets = centred_keys(fold.masking, call.rows, call.cols, k2.dtype)[:, None, :]
        k2[..., call.cols, layout.slope_lane] = offsets


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


def public_lower_right_causal(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """:class:`LowerRightCausal` with public operators only (any device): SDPA with torch's
    bottom-right causal bias, which CUDA runs in its flash or memory-efficient kernels without a
    mask (the CPU materialises one, so the CPU uses :class:`LowerRightCausal`). ``torch.compile``
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


def lower_right_kernel(device: torch.device) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    """Bottom-right causal attention for ``device``: the CPU flash kernel exists only on the CPU."""
    return LowerRightCausal.apply if device.type == "cpu" else public_lower_right_causal


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


def sdpa_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    prior: Prior | None,
    masking: Masking,
    scale: float,
    ssmax: Scaling | None,
) -> Tensor:
    """Prior attention through the SDPA kernel: one unmodified call unless chunks are needed.

    Batch rows whose key spans (document boundaries) or padding differ run as separate groups.
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
        return folded_attention(q, k, v, prior, masking, spans, scale, ssmax)
    # One gather into group order, then views per group: indexing q, k, v once per group would
    # cost the backward a zero-filled whole-batch gradient per group.
    order, sizes = torch.cat(groups), [len(index) for index in groups]
    qs, ks, vs = (t[order].split(sizes) for t in (q, k, v))
    outputs = []
    for index, q_g, k_g, v_g in zip(groups, qs, ks, vs):
        lo, hi = (t if t.shape[0] == 1 else t[index] for t in spans)
        group = select_rows(masking, index)
        outputs.append(folded_attention(q_g, k_g, v_g, prior, group, (lo, hi), scale, ssmax))
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
) -> Tensor:
    """The prior folded into q/k lanes, through the calls of :func:`plan_calls`; rows that see no
    key return zeros."""
    counts = visible_counts(masking, spans) if ssmax is not None else None
    factor = None if counts is None else ssmax.factor(counts)  # (B or 1, H, Lq, 1)
    dtype, bound = q.dtype, 0.0 if prior is None else prior.slope_bound()
    if prior is None:
        lanes = FoldLanes(q.new_zeros(1, q.shape[2], 0), q.new_zeros(1, k.shape[2], 0))
    else:  # a half-precision slope computes in float32 rather than in tiny query runs
        lanes = prior.fold(masking.q_pos, masking.k_pos)
        compute = fold_dtype(largest_slope(lanes.slope, bound), dtype, masking)
        q, k, v = q.to(compute), k.to(compute), v.to(compute)
    width = max(q.shape[-1] + lanes.width, v.shape[-1])
    fold = Fold(masking, scale, ssmax is not None and ssmax.scale_prior, q.shape[1], width)
    # No prior: the calls take q, k, v as they are, and autograd saves no copies.
    run_calls = autograd_calls if prior is None else folded_calls_kernel(q.device)
    precision = slope_precision(q.dtype, masking)
    H = q.shape[1]
    chunk, bands = H, None
    if run_calls is folded_calls:
        chunk = heads_per_thread_team(q.shape[0], torch.get_num_threads())
        if factor is None:  # SSMax scales the slope per row: no band
            bands = slope_bands(q, k, lanes, scale, masking)
    plans = head_plans(masking, spans, lanes.slope, bound, precision, H, chunk, bands)
    return run_calls(fold, plans, q, k, v, lanes, factor).to(dtype)


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
    the steepest slope among the heads allows (:func:`~.prior_inputs.slope_span`; ``bound``: the
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
    q: Tensor, k: Tensor, lanes: FoldLanes, scale: float, masking: Masking
) -> list[int | None] | None:
    """Per head, how many keys before a query's own key can carry weight, or None (no limit).

    Under plain causal masking query i sees its own key ``i + Lk - Lq``; a key ``d`` positions
    before it has a logit ``m_h d`` lower from a slope ``m_h > 0`` (ALiBi, GOAT's recency term,
    seed 000 App. F.3), and at most ``reach_h`` higher from every other lane
    (:func:`lane_reach`), while the row's log-sum-exp is at least its own key's logit. Beyond
    ``d = (reach_h - cutoff) / m_h``, with ``cutoff`` the log of float32's (or float64's)
    ``sqrt(finfo.tiny)`` (:func:`~.lag_flash.smallest_log_weight`, as the ``memeff`` route's weight
    bands), a key's weight
    lies below ``sqrt(tiny)`` of the row's: far below the dtype's resolution, and zero in the
    kernel, which flushes subnormal numbers (``subnormals.py``). Leaving those keys out is exact
    to the dtype, and a steep head then costs ``O(L / m_h)``, not ``O(L^2)``."""
    slope, (Lq, Lk) = lanes.slope, (q.shape[2], k.shape[2])
    # Up to BAND_RUN queries are one run, whose causal square leaves nothing out.
    if slope is None or slope.shape[0] != q.shape[1] or not masking.plain_causal or not BAND_RUN < Lq <= Lk:
        return None
    # Half precision too: the kernel sums in float32, and float16's own sqrt(tiny) is 2^-7.
    cutoff = smallest_log_weight(torch.promote_types(q.dtype, torch.float32))
    steepest = float(slope.detach().max())
    if not steepest > 0 or -cutoff / steepest >= Lk:  # no band short of every key
        return None
    widths = (lane_reach(q, k, lanes, scale) - cutoff) / slope.detach().double()
    return [int(w) + 1 if 0 < w < Lk else None for w in widths.tolist()]


@torch.no_grad()
def lane_reach(q: Tensor, k: Tensor, lanes: FoldLanes, scale: float) -> Tensor:
    """``(H,)`` float64: how far the logit without its slope term (``<q', k'>`` over every other lane
    of :class:`Fold`: content, fold lanes, key bias) can lift one key of a row above another,
    ``2 max_i |q'_i| max_j |k'_j|`` (Cauchy-Schwarz) over the batch; the norms of the parts bound
    those of the whole. A thousandth more covers the rounding of the norms."""
    H, Hkv = q.shape[1], k.shape[1]
    queries = scale**2 * largest_square(q) + largest_square(lanes.q)
    keys = largest_square(k).repeat_interleave(H // Hkv) + largest_square(lanes.k)
    if lanes.key_bias is not None:  # <1, u_h(j)>
        queries = queries + 1
        keys = keys + largest_square(lanes.key_bias[..., None])
    return 2.002 * (queries * keys).sqrt()


def largest_square(t: Tensor) -> Tensor:
    """``(heads or 1,)`` float64: the largest squared norm of ``t``'s rows ``(..., heads or 1, L, D)``
    per head (dim -3; without one, a single value)."""
    norms = torch.linalg.vector_norm(t, dim=-1, dtype=torch.promote_types(t.dtype, torch.float32)).amax(-1)
    heads = t.shape[-3] if t.dim() > 2 else 1
    return norms.reshape(-1, heads).amax(0).double().square()


def folded_calls(
    fold: Fold, plans: Plans, q: Tensor, k: Tensor, v: Tensor, lanes: FoldLanes, factor: Tensor | None
) -> Tensor:
    """:class:`FoldedCalls` on the inputs of :func:`flash_inputs`, which autograd builds and carries back."""
    q2, k2, v2 = flash_inputs(fold, q, k, v, lanes, factor)
    return FoldedCalls.apply(fold, plans, Layout.of(k, v, lanes, k2, v2), q2, k2, v2)


def folded_calls_kernel(device: torch.device) -> Callable[..., Tensor]:
    """How a prior's calls run: through the CPU flash kernel's forward and backward where they exist
    (the CPU, eagerly), else with autograd through public SDPA (other devices, and ``torch.compile``,
    which traces public operators and finds no thread state to keep)."""
    if device.type == "cpu" and not torch.compiler.is_compiling():
        return folded_calls
    return autograd_calls


def autograd_calls(
    fold: Fold, plans: Plans, q: Tensor, k: Tensor, v: Tensor, lanes: FoldLanes, factor: Tensor | None
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
        q2 = fold.queries(queries[rows], call_lanes, None if factor is None else factor[..., rows, :])
        k2, v2 = fold.keys(keys[cols], values[cols], call_lanes, rows, cols)
        outputs.append(attend(q2, k2, v2, call)[..., :Dv])
        done = rows.stop
    if done < Lq:
        outputs.append(unseen[:, :, done:])
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)


def is_decode_step(q: Tensor, k: Tensor) -> bool:
    """A few queries against a longer cache, whose bias tile is small: :func:`sdpa_bias_attention`'s case."""
    B, H, Lq = q.shape[:3]
    Lk = k.shape[2]
    return Lq <= DECODE_QUERIES and Lq < Lk and B * H * Lq * Lk <= BIAS_TILE_CELLS


def flash_takes(q: Tensor, k: Tensor, v: Tensor, bias: Tensor) -> bool:
    """Whether a decode step may run the CPU flash kernel with the tile as its mask: one width for
    q, k and v (a layer's KV cache keeps its keys padded to the values' width for this:
    ``KVCache.padded_keys``), one dtype, float32 or float64 (half precision computes in float32
    here), and no gradient asked of the tile (the kernel's backward gives none to its mask)."""
    same = q.shape[-1] == k.shape[-1] == v.shape[-1]
    plain = q.dtype == k.dtype == v.dtype == bias.dtype and q.dtype in (torch.float32, torch.float64)
    return same and plain and q.device.type == "cpu" and not (torch.is_grad_enabled() and bias.requires_grad)


def sdpa_bias_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    prior: Prior,
    masking: Masking,
    scale: float,
    ssmax: Scaling | None,
) -> Tensor:
    """A decode step: logits ``scale <q, k> + K`` with the prior's log-prior tile ``(B, H, Lq, Lk)``.

    With few queries the tile is smaller than the keys: folding would rebuild ``[k, k_lanes]`` (and
    pad ``v``) for every cached key at every step, an O(Lk D) copy as costly as the attention itself,
    while the tile is O(H Lk). Any prior fits, folding or not, and the tile is the reference's own
    ``log_prior``; on run positions (a generation's) ``log_prior_of_runs``, which priors with
    position tables answer with a view of them, so building the tile costs nothing per key.
    A row that sees no key (or only keys with a -inf log-prior) returns zeros, as on the reference
    route.

    Where :func:`flash_takes`, the CPU flash kernel takes the tile as its additive mask and reads k
    and v once, grouped query heads as extra queries of their key/value head (no copy of the
    cache). Otherwise (keys narrower than values, half precision, a tile that needs its gradient,
    other devices) the products are taken directly.
    """
    Lq, Lk = q.shape[2], k.shape[2]
    dtype = compute_dtype(q.dtype)
    if masking.starts is None:
        bias = prior.log_prior(masking.q_pos, masking.k_pos).to(dtype)  # (B or 1, H, Lq, Lk)
    else:  # positions are runs (a generation's): the prior's tables give views, no work per key
        bias = prior.log_prior_of_runs(masking.q_start, Lq, masking.k_start, Lk, q.device, dtype)
    # The usual step, one newest query under a plain causal mask, sees every key: nothing to hide.
    visible = None if masking.plain_causal and Lq == 1 else masking.visible()  # (B or 1, 1, Lq, Lk)
    q = q.to(dtype) * scale
    if ssmax is not None:
        counts = torch.full((1, 1), Lk) if visible is None else visible.sum(-1)[:, 0]
        factor = ssmax.factor(counts.to(q.device)).to(dtype)  # (B or 1, H, Lq, 1)
        q = q * factor
        if ssmax.scale_prior:
            bias = bias * factor
    if flash_takes(q, k, v, bias):
        if visible is not None:  # the kernel returns zeros for a row of -inf (tested)
            bias = bias.masked_fill(~visible, -torch.inf)
        B, H, Hkv = *q.shape[:2], k.shape[1]
        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        mask = grouped(bias.expand(B, H, Lq, Lk), Hkv)
        out = flash(grouped(q, Hkv), k, v, 0.0, False, attn_mask=mask, scale=1.0)[0]
        return out.view(B, H, Lq, v.shape[-1])
    logits = grouped_scores(q, k.to(dtype)) + bias
    if visible is None:
        return grouped_values(torch.softmax(logits, dim=-1), v.to(dtype)).to(v.dtype)
    probs = torch.softmax(logits.masked_fill_(~visible, torch.finfo(dtype).min), dim=-1)
    probs = probs * visible  # as masked_softmax: a row with no visible or only -inf logits gets zeros
    return grouped_values(probs, v.to(dtype)).to(v.dtype)
