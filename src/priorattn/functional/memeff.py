"""The memory-efficient route: any prior, forward and backward, attention memory O(L).

Two algorithms, chosen per call:

- **the flash path** (``lag_flash.py``), when the bias and the masks depend on the lag ``i - j``
  only: a relative prior (GGD, ALiBi, ...) or none, causal order and/or a sliding window, positions
  that are one run shared by the batch, no documents or key padding, SSMax not scaling the prior,
  equal q/k and v head widths, on the CPU outside ``torch.compile``. The prior is evaluated once on
  the ``Lq + Lk - 1`` lags, hidden lags set to -inf, and each block of query rows is one call of
  PyTorch's fused CPU flash kernel with a Hankel view of that table as its additive mask (no copy).
  Backward: the kernel's own when the table needs no gradient; otherwise small tiles rebuild the
  weights and sum ``dS`` along its diagonals into the table's gradient.
- **the general blocks** (everything else): queries are taken in blocks of rows
  (:func:`block_rows`). A block builds its logits against the keys it can see, takes their softmax
  and weighted sum, and keeps only its output. The backward pass (a custom autograd function, as in
  FlashAttention) rebuilds one block's weights at a time, so no ``Lq x Lk`` tensor ever lives in
  memory.

In the general blocks, logits are ``<q2_i, k2_j> + bias_ij`` where ``q2``/``k2`` carry the content
(and a folded prior's lanes) and the bias is whatever part of the prior is not in the lanes,
cheapest first:

- a prior that folds: its key-only terms ``u_h(j) + m_h (k_pos[j] - centre)``, one row per block
  (the slope re-centred on the block's queries, the key terms on its keys, see ``prior_inputs.py``),
  and the op's ``key_bias``, which joins ``u_h(j)`` beside any prior;
- a relative prior (``K`` depends on ``i - j`` only) on contiguous positions: the prior is evaluated
  once on the ``Lq + Lk - 1`` possible lags, and each block's bias is read from that table: a
  Toeplitz block read with its keys in reverse order is a strided (Hankel) view of it, and one flip
  of the block restores the key order;
- otherwise: ``prior.log_prior`` on the block's positions.

The bias of a block is a small differentiable function of its inputs (key terms, table, prior
parameters, SSMax factors); the backward pass rebuilds it under autograd and pulls the gradient of
the logits back through it, so every prior parameter gets its gradient without custom code.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from ..priors import Prior
from ..ssmax import Scaling
from .grouped import grouped, grouped_scores, grouped_values
from .inplace import softmax_
from .lag_flash import anti_diagonal_sums, keys_reversed, lag_flash_applies, lag_flash_attention
from .masks import Masking
from .prior_inputs import (
    centred_key_bias,
    centred_keys,
    key_bias_drift,
    key_rates,
    lag_table,
    largest_slope,
    prior_factor,
    slope_span,
    split_prior,
)
from .reference import compute_dtype
from .spans import cut, key_spans, visible_counts
from .subnormals import flushing_subnormals

#: Logit cells per block (``B * H * rows * Lk``): 2^21 floats are 8 MB in float32.
BLOCK_CELLS = 1 << 21
#: Bounds on the rows of a block: fewer rows make small matrix products; more, big blocks.
MIN_ROWS, MAX_ROWS = 16, 256


def block_rows(B: int, H: int, Lk: int) -> int:
    """Query rows per block, so that a block's logits stay near :data:`BLOCK_CELLS` cells."""
    return min(MAX_ROWS, max(MIN_ROWS, BLOCK_CELLS // max(B * H * Lk, 1)))


def key_blocks(
    masking: Masking, spans: tuple[Tensor, Tensor] | None, step: int
) -> tuple[tuple[slice, slice], ...]:
    """Blocks of ``step`` query rows, each with the key columns its rows can possibly see (in any
    batch row): causal masking drops the keys past the last query, a window the keys behind its
    first, documents the other documents' keys (``spans``: see ``spans.key_spans``; None: every
    key); blocks that see no key are left out."""
    Lq, Lk = masking.q_pos.shape[-1], masking.k_pos.shape[-1]
    if spans is None:  # plain causal is known from the arguments alone: key j <= i + Lk - Lq
        reach = Lk - Lq if masking.plain_causal else Lk
        return tuple((rows, slice(0, min(Lk, rows.stop + reach))) for rows in cut(0, Lq, step))
    lo, hi = spans[0].amin(0).tolist(), spans[1].amax(0).tolist()
    blocks = ((rows, min(lo[rows]), max(hi[rows])) for rows in cut(0, Lq, step))
    return tuple((rows, slice(c0, c1)) for rows, c0, c1 in blocks if c1 > c0)


def toeplitz_tile(table: Tensor, rows: slice, cols: slice, Lk: int) -> Tensor:
    """Bias ``(H, lq, lk)`` of query ``rows`` against keys ``cols`` from the lag table.

    Query i and key j read table index ``i - j + Lk - 1``: constant along diagonals (Toeplitz).
    With the block's keys taken in reverse order it is a Hankel view: row i of the block is the
    window of ``lk`` lags from ``keys_reversed + i`` (``unfold``, no copy, and traceable by
    ``torch.compile``); one flip of the block puts the keys back in order.
    """
    lq, lk = rows.stop - rows.start, cols.stop - cols.start
    start = keys_reversed(rows, cols, Lk)
    return table.unfold(-1, lk, 1)[:, start : start + lq].flip(-1)


@dataclass(frozen=True)
class Plan:
    """What one call's blocks need besides tensors: the keys each block sees, and how to build its bias."""

    masking: Masking
    prior: Prior | None  # set only when the bias comes from ``prior.log_prior`` tiles
    blocks: tuple[tuple[slice, slice], ...]  # query rows and the key columns they can see (key_blocks)
    dtype: torch.dtype  # of the logits
    centred_bias: bool = False  # the key terms hold the op's key bias: centre them per block

    def bias(
        self,
        rows: slice,
        cols: slice,
        key_bias: Tensor | None,
        slope: Tensor | None,
        table: Tensor | None,
        row_scale: Tensor | None,
    ) -> Tensor | None:
        """The block's bias ``(B or 1, H or 1, lq or 1, lk)`` from its differentiable sources."""
        terms = []
        if key_bias is not None:  # GOAT's sink u_h(j) (seed 000 Eq. 19) and the op's key bias
            row = centred_key_bias(key_bias, cols, self.dtype) if self.centred_bias else key_bias[..., cols]
            terms.append(row[..., None, :])
        if slope is not None:  # m_h (k_pos[j] - centre), seed 000 Prop. F.6
            offset = centred_keys(self.masking, rows, cols, slope.dtype)
            terms.append(slope[:, None, None] * offset[:, None, None, :])
        if table is not None:
            terms.append(toeplitz_tile(table, rows, cols, self.masking.k_pos.shape[-1])[None])
        if self.prior is not None:
            tile = self.prior.log_prior(self.masking.q_pos[:, rows], self.masking.k_pos[:, cols])
            terms.append(tile.to(self.dtype))
        if not terms:
            return None
        bias = terms[0] if len(terms) == 1 else sum(terms)
        if row_scale is not None:  # SSMax's factor, a query gate (prior_inputs.prior_factor)
            bias = bias * row_scale[:, :, rows]
        return bias

    def probs(
        self, q2: Tensor, k2: Tensor, bias: Tensor | None, rows: slice, cols: slice, buffer: Tensor
    ) -> Tensor:
        """Attention weights ``(B, H, lq, lk)`` of one block, computed in ``buffer`` (see
        :func:`block_buffer`); a row with no visible key is all zero."""
        B, H, lq, _ = q2.shape
        logits = buffer[: B * H * lq * k2.shape[2]].view(B, H, lq, k2.shape[2])
        torch.matmul(grouped(q2, k2.shape[1]), k2.transpose(-1, -2), out=grouped(logits, k2.shape[1]))
        if bias is not None:
            logits += bias
        # Hidden cells are filled with the lowest finite value and their weights zeroed after the
        # softmax, as in masked_softmax: a row whose visible logits are all -inf gets no weight.
        lowest = torch.finfo(logits.dtype).min
        if self.masking.plain_causal:  # only the block's newest lq keys can be hidden: a triangle
            hidden = torch.ones(lq, lq, dtype=torch.bool, device=q2.device).triu_(1)
            logits[..., -lq:].masked_fill_(hidden, lowest)
            probs = softmax_(logits)
            probs[..., -lq:].masked_fill_(hidden, 0.0)
            return probs
        visible = self.masking.visible(rows, cols)
        return softmax_(logits.masked_fill_(~visible, lowest)).mul_(visible)


def block_buffer(plan: Plan, q2: Tensor) -> Tensor:
    """A flat buffer for the largest block's ``B x H x lq x lk`` cells, reused by every block of a
    pass. Blocks allocated one by one left GOAT via this route at 1.22x plain SDPA's peak memory at
    L = 16384, mostly memory the allocator kept (1.09x when told to return it with
    ``MALLOC_MMAP_THRESHOLD_``); with the buffers and :func:`add_product`, 1.09x."""
    B, H = q2.shape[:2]
    cells = max((B * H * (r.stop - r.start) * (c.stop - c.start) for r, c in plan.blocks), default=0)
    return q2.new_empty(cells)


#: Positions of the bias sources among ``BlockwiseAttention``'s inputs after ``q2, k2, v``.
KEY_BIAS, SLOPE, TABLE, ROW_SCALE = range(4)


def diagonal_sums(x: Tensor) -> Tensor:
    """``s[..., d] = sum over i - j = d - (m - 1) of x[..., i, j]``: ``(..., n, m) -> (..., n + m - 1)``.

    The gradient of a Toeplitz block with respect to the lag table it was read from: with the keys
    reversed, ``j' = m - 1 - j``, its diagonals are anti-diagonals.
    """
    return anti_diagonal_sums(x.flip(-1))


def sum_to(grad: Tensor, shape: torch.Size) -> Tensor:
    """Sum ``grad`` over the dimensions that ``shape`` broadcasts (size 1)."""
    dims = [d for d, (g, s) in enumerate(zip(grad.shape, shape)) if s == 1 and g != 1]
    return grad.sum(dims, keepdim=True) if dims else grad


class BlockwiseAttention(torch.autograd.Function):
    """Blockwise softmax attention; the backward rebuilds each block's weights (flash-style). Both
    passes run with subnormals flushed where that pays (``subnormals.py``): a steep or
    far-reaching prior gives distant keys weights below 2^-126, and the block products on them ran
    2-3x slower (GOAT via this route at L = 4096 on one thread: 5x plain SDPA's time, 2.2x flushed)."""

    @staticmethod
    def forward(ctx, plan: Plan, q2, k2, v, key_bias, slope, table, row_scale, *params):
        ctx.plan, ctx.params = plan, params
        ctx.save_for_backward(q2, k2, v, key_bias, slope, table, row_scale)
        sources = (key_bias, slope, table, row_scale)
        with flushing_subnormals(q2.device):
            return blockwise_forward(plan, q2, k2, v, *sources)

    @staticmethod
    def backward(ctx, grad_out):
        with flushing_subnormals(grad_out.device):
            return blockwise_backward(ctx, grad_out)


@torch.no_grad()
def blockwise_forward(plan: Plan, q2, k2, v, key_bias, slope, table, row_scale) -> Tensor:
    """:class:`BlockwiseAttention`'s output: each block's weights times its values."""
    B, H, Lq, _ = q2.shape
    out = q2.new_zeros(B, H, Lq, v.shape[-1])
    buffer = block_buffer(plan, q2)
    for rows, cols in plan.blocks:
        bias = plan.bias(rows, cols, key_bias, slope, table, row_scale)
        probs = plan.probs(q2[:, :, rows], k2[:, :, cols], bias, rows, cols, buffer)
        out[:, :, rows] = grouped_values(probs, v[:, :, cols])
    return out


def add_product(total: Tensor, a: Tensor, b: Tensor) -> None:
    """``total += a @ b`` in place for ``(B, Hkv, n, m)`` batches: no ``(B, Hkv, lk, D)`` product per
    block (two of 16 MB at L = 16384, reallocated block after block). ``view`` (not ``reshape``)
    raises rather than add into a copy."""
    total.view(-1, *total.shape[-2:]).baddbmm_(a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:]))


@torch.no_grad()
def blockwise_backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, ...]:
    """:class:`BlockwiseAttention`'s gradients, one block's weights rebuilt at a time."""
    plan: Plan = ctx.plan
    q2, k2, v, *sources = ctx.saved_tensors
    # Bias sources become fresh leaves so each block's bias can be rebuilt under autograd; the lag
    # table is the exception: its gradient is summed along anti-diagonals directly (autograd
    # through an overlapping strided view would build index tensors of the block's size).
    leaves = [
        None if t is None else t.detach().requires_grad_(ctx.needs_input_grad[4 + i] and i != TABLE)
        for i, t in enumerate(sources)
    ]
    wanted = [t for t in leaves if t is not None and t.requires_grad]
    wanted += [p for p, need in zip(ctx.params, ctx.needs_input_grad[8:]) if need]
    table, row_scale = sources[TABLE], sources[ROW_SCALE]
    d_table = torch.zeros_like(table) if table is not None and ctx.needs_input_grad[4 + TABLE] else None
    B, H, Lq, D = q2.shape
    Hkv = v.shape[1]
    # Contiguous whatever the inputs' layout (v may be a transposed view): add_product views them.
    dq, dk, dv = (torch.zeros_like(t, memory_format=torch.contiguous_format) for t in (q2, k2, v))
    d_wanted = [torch.zeros_like(t) for t in wanted]
    probs_buffer, grads_buffer = block_buffer(plan, q2), block_buffer(plan, q2)
    for rows, cols in plan.blocks:
        with torch.enable_grad():
            bias = plan.bias(rows, cols, *leaves)
        detached = None if bias is None else bias.detach()
        probs = plan.probs(q2[:, :, rows], k2[:, :, cols], detached, rows, cols, probs_buffer)
        d_out = grouped(grad_out[:, :, rows], Hkv)
        add_product(dv[:, :, cols], grouped(probs, Hkv).transpose(-1, -2), d_out)
        d_probs = grads_buffer[: probs.numel()].view_as(probs)
        torch.matmul(d_out, v[:, :, cols].transpose(-1, -2), out=grouped(d_probs, Hkv))
        # dS = P * (dP - delta), delta = rowsum(P * dP): the softmax's own backward, as autograd
        # runs it for the reference. A block holds every key its rows can see, so delta comes
        # from the block's own weights, not from FlashAttention's rowsum(dO * O) (needed there
        # because a row's keys span blocks). The shortcut equals it only up to the rounding of
        # two differently ordered sums, and that residual survives where the exact dS is 0: a
        # row with one visible key has P = 1 whatever its logit. A steep bias (GGD, beta < 0,
        # near j - i = mu) multiplies it into a prior gradient of ~1e-3 that should be 0.
        # Here, when a row's weight sits on one key (P one-hot), delta = dP there exactly and
        # dS is exactly 0, as in exact arithmetic.
        delta = torch.einsum("...j,...j->...", probs, d_probs)[..., None]  # no block-sized product
        d_logits = probs.mul_(d_probs.sub_(delta))
        grouped_d_logits = grouped(d_logits, Hkv)
        dq[:, :, rows] = (grouped_d_logits @ k2[:, :, cols]).view(B, H, -1, D)
        add_product(dk[:, :, cols], grouped_d_logits.transpose(-1, -2), grouped(q2[:, :, rows], Hkv))
        if d_table is not None:
            d_tile = d_logits * row_scale[:, :, rows] if row_scale is not None else d_logits
            d_tile = sum_to(d_tile, (1, *d_table.shape[:1], *d_tile.shape[2:]))[0]  # (H or 1, lq, lk)
            start = keys_reversed(rows, cols, plan.masking.k_pos.shape[-1])
            d_table[:, start : start + sum(d_tile.shape[-2:]) - 1] += diagonal_sums(d_tile)
        if bias is not None and bias.requires_grad:
            grads = torch.autograd.grad(bias, wanted, sum_to(d_logits, bias.shape), allow_unused=True)
            for total, g in zip(d_wanted, grads):
                if g is not None:
                    total += g
    found = iter(d_wanted)
    source_grads = [next(found) if t is not None and t.requires_grad else None for t in leaves]
    source_grads[TABLE] = d_table
    param_grads = [next(found) if need else None for need in ctx.needs_input_grad[8:]]
    return (None, dq, dk, dv, *source_grads, *param_grads)


def checkpointed_blocks(plan: Plan, q2: Tensor, k2: Tensor, v: Tensor, *sources: Tensor | None) -> Tensor:
    """:class:`BlockwiseAttention`'s output through public operators and autograd, for
    ``torch.compile``, which cannot trace that Function's backward (``torch.autograd.grad`` of each
    block's bias, buffers written in place). Each block runs under activation checkpointing: its
    weights are rebuilt in the backward instead of kept, so attention memory stays O(block) as in
    the Function, and autograd carries the gradients to every bias source and prior parameter.
    Rows of no block (they see no key) return zeros."""
    B, H, Lq, _ = q2.shape
    pieces, done = [], 0
    for rows, cols in plan.blocks:
        if rows.start > done:
            pieces.append(q2.new_zeros(B, H, rows.start - done, v.shape[-1]))
        piece = checkpoint(block_values, plan, q2, k2, v, sources, rows, cols, use_reentrant=False)
        pieces.append(piece)
        done = rows.stop
    if done < Lq:
        pieces.append(q2.new_zeros(B, H, Lq - done, v.shape[-1]))
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=2)


def block_values(
    plan: Plan, q2: Tensor, k2: Tensor, v: Tensor, sources: tuple, rows: slice, cols: slice
) -> Tensor:
    """One block's weights times its values ``(B, H, lq, Dv)`` (:meth:`Plan.probs` without buffers)."""
    logits = grouped_scores(q2[:, :, rows], k2[:, :, cols])
    bias = plan.bias(rows, cols, *sources)
    if bias is not None:
        logits = logits + bias
    visible = plan.masking.visible(rows, cols)
    probs = torch.softmax(logits.masked_fill(~visible, torch.finfo(logits.dtype).min), dim=-1) * visible
    return grouped_values(probs, v[:, :, cols])


def memeff_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    prior: Prior | None,
    masking: Masking,
    scale: float,
    ssmax: Scaling | None,
    key_bias: Tensor | None = None,
) -> Tensor:
    """Blockwise prior attention: ``(B, H, Lq, Dv)``; attention memory O(BLOCK_CELLS), not O(Lq Lk).
    ``key_bias`` ``(B or 1, H or 1, Lk)`` is a row of each block's bias, centred on the block's keys
    (:func:`~.prior_inputs.centred_key_bias`)."""
    dtype = compute_dtype(q.dtype)
    spans = key_spans(masking) if masking.masks_anything and not masking.plain_causal else None
    factor = None if ssmax is None else ssmax.factor(visible_counts(masking, spans)).to(dtype)
    row_scale = prior_factor(q, prior, factor, ssmax is not None and ssmax.scale_prior)
    row_scale = None if row_scale is None else row_scale.to(dtype)
    if key_bias is None and lag_flash_applies(prior, masking, q, v, row_scale is not None):
        # q, k, v keep their dtype: the kernel takes half precision with the float32 table as its
        # mask and sums in float32, as SDPA does for the same inputs (bfloat16: 1.8x faster).
        content = split_prior(q, k, None, masking, scale, factor, None)
        table = None if prior is None else lag_table(prior, masking).to(dtype)
        blocks = functools.partial(key_blocks, masking, spans)
        horizon = None if prior is None else prior.constant_beyond()
        return lag_flash_attention(content.q.to(q.dtype), k, v, table, masking, blocks, dtype, horizon)
    inputs = split_prior(q.to(dtype), k.to(dtype), prior, masking, scale, factor, row_scale, key_bias)
    span = None
    rates = key_rates(inputs.slope, key_bias_drift(key_bias))
    if rates is not None:
        bound = 0.0 if inputs.slope is None else prior.slope_bound()
        span = slope_span(largest_slope(rates, bound), dtype)
    plan = Plan(
        masking=masking,
        prior=inputs.dense,
        blocks=key_blocks(masking, spans, min(block_rows(*q.shape[:2], k.shape[2]), span or q.shape[2])),
        dtype=dtype,
        centred_bias=key_bias is not None,
    )
    params = [] if inputs.dense is None else [p for p in inputs.dense.parameters() if p.requires_grad]
    sources = (inputs.key_bias, inputs.slope, inputs.table, row_scale)
    if torch.compiler.is_compiling():
        return checkpointed_blocks(plan, inputs.q, inputs.k, v.to(dtype), *sources).to(v.dtype)
    out = BlockwiseAttention.apply(plan, inputs.q, inputs.k, v.to(dtype), *sources, *params)
    return out.to(v.dtype)
