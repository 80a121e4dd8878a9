"""The autograd Functions over the CPU flash kernel's own forward and backward:
:class:`LowerRightCausal` (bottom-right causal attention without a mask) and :class:`FoldedCalls` (a
prior's calls on ``q'``, ``k'``, ``v'`` built once per pass, the slope and key bias lanes re-centred
in place).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ...priors import FoldLanes
from ..prior_inputs import (
    centred_key_bias,
    centred_keys,
)
from ..spans import Call, Kind, cut
from ..subnormals import flushing_subnormals
from .fold import Fold, every_head, to_width
from .planning import Plans

#: Most keys one kernel call of a folded route takes; longer calls merge blocks by log-sum-exp, so
#: the kernel's backward returns the gradients of no more keys than this at a time.
KEY_BLOCK = 4096


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


def flash_call(q2: Tensor, k2: Tensor, v2: Tensor, call: Call) -> tuple[Tensor, Tensor]:
    """The output and log-sum-exp of ``call``'s queries: the kernel on each block of its keys, merged."""
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    q_call, merged = q2[:, :, call.rows], None
    for block in key_blocks(call):
        k_block, v_block, mask = k2[:, :, block.cols], v2[:, :, block.cols], block.bias(q2.dtype)
        part = flash(q_call, k_block, v_block, 0.0, block.causal, attn_mask=mask, scale=1.0)
        merged = part if merged is None else merge(merged, part)
    return merged


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


def folded_calls(
    fold: Fold,
    plans: Plans,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    lanes: FoldLanes,
    factor: Tensor | None,
    row_factor: Tensor | None,
) -> Tensor:
    """:class:`FoldedCalls` on the inputs of :func:`flash_inputs`, which autograd builds and carries back."""
    q2, k2, v2 = flash_inputs(fold, q, k, v, lanes, factor, row_factor)
    return FoldedCalls.apply(fold, plans, Layout.of(fold, k, v, lanes, k2, v2), q2, k2, v2)


def flash_inputs(
    fold: Fold,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    lanes: FoldLanes,
    factor: Tensor | None,
    row_factor: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """``q'`` of every query and ``k'``, ``v'`` of every key as the flash kernel takes them: ``width``
    lanes, one head per query head, the slope lane centred on the last query (:func:`recentre`
    centres it on each call's queries)."""
    q2 = to_width(fold.queries(q, lanes, factor, row_factor), fold.width)
    k2, v2 = fold.keys(k, v, lanes, slice(0, q.shape[2]), slice(0, k.shape[2]))
    return q2, every_head(to_width(k2, fold.width), fold.heads), every_head(v2, fold.heads)


def recentre(fold: Fold, k2: Tensor, layout: Layout, call: Call, heads: slice) -> None:
    """Centre the slope lane of ``k2`` (:func:`flash_inputs`, its ``heads``) on ``call``'s queries and
    its key bias lane on ``call``'s keys, in place."""
    if layout.slope_lane is not None:
        offsets = centred_keys(fold.masking, call.rows, call.cols, k2.dtype)[:, None, :]
        k2[..., call.cols, layout.slope_lane] = offsets
    if layout.key_bias is not None:
        key_bias = layout.key_bias if layout.key_bias.shape[-2] == 1 else layout.key_bias[..., heads, :]
        k2[..., call.cols, layout.bias_lane] = centred_key_bias(key_bias, call.cols, k2.dtype)


@dataclass(frozen=True)
class Layout:
    """What :class:`FoldedCalls` needs to know of :func:`flash_inputs`' results: the index of the
    slope lane in ``k'`` (None: no slope), of the key bias lane, and the key bias ``(.., H or 1, Lk)``
    it re-centres per call (None where the lane holds no op ``key_bias``; detached: autograd carries
    its gradient from ``k'``), the values' own width, and whether ``k'`` and ``v'`` are ``k`` and
    ``v`` themselves (no lane to add or pad), which the backward must not write into."""

    slope_lane: int | None
    values: int
    shared: tuple[bool, bool]
    bias_lane: int | None = None
    key_bias: Tensor | None = None

    @classmethod
    def of(cls, fold: Fold, k: Tensor, v: Tensor, lanes: FoldLanes, k2: Tensor, v2: Tensor) -> Layout:
        """The layout of ``k2``, ``v2``: :func:`flash_inputs` of ``k``, ``v`` and ``lanes``; the key
        bias is kept where ``fold`` centres it."""
        first = k.shape[-1] + lanes.k.shape[-1]  # the lane after the content and the fold's lanes
        has_bias = lanes.key_bias is not None
        slope_lane = None if lanes.slope is None else first + has_bias
        key_bias = lanes.key_bias.detach() if has_bias and fold.centred_bias else None
        return cls(slope_lane, v.shape[-1], (k2 is k, v2 is v), first if has_bias else None, key_bias)


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
            recentre(fold, k2[:, heads], layout, call, heads)
            out[:, heads, call.rows], lse[:, heads, call.rows] = flash_call(
                q2[:, heads], k2[:, heads], v2[:, heads], call
            )
    return out, lse


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
            recentre(fold, k2, layout, call, heads)
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
