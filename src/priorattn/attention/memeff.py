"""The memory-efficient route: any prior, forward and backward, attention memory O(L).

Queries are taken in blocks of :data:`BLOCK` rows. Each block builds its logits against the keys it
can see, softmaxes and reduces them, and keeps only its output. Under autograd each block is
checkpointed: the backward pass rebuilds one block's logits at a time, so no ``Lq x Lk`` tensor ever
lives in memory, and the gradients of every prior parameter flow through ordinary autograd.

Where the log-prior of a block comes from, cheapest first:

- a prior that folds: extra q/k lanes (seed 000 Eq. 20-24), no bias at all;
- a relative prior (``K`` depends on ``i - j`` only) on contiguous positions: the prior is evaluated
  once on the ``Lq + Lk - 1`` possible lags, and each block's bias is a zero-copy strided view of that
  table. A Toeplitz block becomes a strided (Hankel) view once its keys are taken in reverse order,
  so this path reverses the keys once up front;
- otherwise: ``prior.log_prior`` on the block's positions.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from ..priors import FoldLanes, Prior
from ..ssmax import Scaling
from .folding import key_terms, lane_inputs, slope_span
from .grouped import grouped_scores, grouped_values
from .masks import Masking
from .reference import compute_dtype, masked_softmax, prior_logits

#: Query rows per block: logits of one block are ``B * H * BLOCK * Lk`` floats.
BLOCK = 128


def lag_table(prior: Prior, masking: Masking) -> Tensor | None:
    """``K_h(d)`` for every lag ``d = q_pos - k_pos`` of the call, ``(H, Lq + Lk - 1)``, or None.

    Index ``x`` holds lag ``min_lag + x``. Only for relative priors on positions that are one
    contiguous run shared by the batch, where ``min_lag = q_pos[0] - k_pos[-1]``.
    """
    q_pos, k_pos = masking.q_pos, masking.k_pos
    if not prior.is_relative or q_pos.shape[0] != 1 or k_pos.shape[0] != 1:
        return None
    Lq, Lk = q_pos.shape[-1], k_pos.shape[-1]
    if not (
        torch.equal(q_pos[0], q_pos[0, 0] + torch.arange(Lq, device=q_pos.device))
        and torch.equal(k_pos[0], k_pos[0, 0] + torch.arange(Lk, device=k_pos.device))
    ):
        return None
    lags = q_pos[0, 0] - k_pos[0, -1] + torch.arange(Lq + Lk - 1, device=q_pos.device)
    table = prior.log_prior(lags, torch.zeros(1, dtype=torch.long, device=lags.device))
    return table.reshape(-1, Lq + Lk - 1).contiguous()  # (H or 1, N)


def hankel_tile(table: Tensor, rows: slice, num_cols: int, Lk: int) -> Tensor:
    """Block bias ``(H, lq, lk)`` for query ``rows`` against the last ``num_cols`` reversed keys.

    Reversed key ``j'`` is original key ``Lk - 1 - j'``, so the lag of tile cell ``(i, j)`` is
    ``min_lag + (rows.start - num_cols + Lk) + i + j``: constant along anti-diagonals, a strided view.
    """
    start = rows.start - num_cols + Lk
    shape = (table.shape[0], rows.stop - rows.start, num_cols)
    return table.as_strided(shape, (table.stride(0), 1, 1), table.storage_offset() + start)


def attend_block(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    prior: Prior | None,
    lanes: FoldLanes | None,
    table: Tensor | None,
    masking: Masking,
    rows: slice,
    cols: slice,
    scale: float,
    ssmax: Scaling | None,
) -> Tensor:
    """Output of query ``rows`` against key ``cols``; q, k, v arrive already sliced."""
    visible = masking.visible(rows, cols)
    if lanes is not None:
        dtype = compute_dtype(q.dtype)
        factor = None if ssmax is None else ssmax.factor(visible.sum(-1)[:, 0]).to(dtype)
        scale_prior = ssmax is not None and ssmax.scale_prior
        q2, k2 = lane_inputs(q.to(dtype), k.to(dtype), lanes, rows, cols, scale, factor, scale_prior)
        logits = grouped_scores(q2, k2)
        terms = key_terms(lanes, masking, rows, cols)
        if terms is not None:
            terms = terms[..., None, :].to(dtype)  # (B or 1, H, 1, lk): the same for every query
            logits = logits + (terms * factor if factor is not None and scale_prior else terms)
    else:
        if table is not None:
            log_prior = hankel_tile(table, rows, k.shape[2], masking.k_pos.shape[-1])
        elif prior is not None:
            log_prior = prior.log_prior(masking.q_pos[:, rows], masking.k_pos[:, cols])
        else:
            log_prior = None
        logits = prior_logits(q, k, log_prior, scale, ssmax, visible)
    probs = masked_softmax(logits, visible)
    return grouped_values(probs, v.to(probs.dtype)).to(v.dtype)


def key_bound(masking: Masking, rows: slice) -> int:
    """How many keys (in index order) a block of queries can see: under plain causal masking none
    past the block's last query, otherwise all."""
    Lq, Lk = masking.q_pos.shape[-1], masking.k_pos.shape[-1]
    return Lk - Lq + rows.stop if masking.plain_causal else Lk


def memeff_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    prior: Prior | None,
    masking: Masking,
    scale: float,
    ssmax: Scaling | None,
) -> Tensor:
    """Blockwise prior attention: ``(B, H, Lq, Dv)`` with O(BLOCK * Lk) attention memory."""
    Lq, Lk = q.shape[2], k.shape[2]
    folds = prior is not None and prior.can_fold(masking.causal)
    lanes = prior.fold(masking.q_pos, masking.k_pos) if folds else None
    table = None if prior is None or folds else lag_table(prior, masking)
    keys = masking.reversed_keys() if table is not None else masking
    if table is not None:
        k, v = k.flip(2), v.flip(2)
    span = None if lanes is None else slope_span(lanes, compute_dtype(q.dtype))
    step = BLOCK if span is None else min(BLOCK, span)
    grad = torch.is_grad_enabled()
    outputs = []
    for start in range(0, Lq, step):
        rows = slice(start, min(start + step, Lq))
        bound = key_bound(masking, rows)
        cols = slice(Lk - bound, Lk) if table is not None else slice(0, bound)
        args = (
            q[:, :, rows],
            k[:, :, cols],
            v[:, :, cols],
            prior,
            lanes,
            table,
            keys,
            rows,
            cols,
            scale,
            ssmax,
        )
        outputs.append(checkpoint(attend_block, *args, use_reentrant=False) if grad else attend_block(*args))
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)
