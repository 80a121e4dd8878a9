"""The memory-efficient route: any prior, forward and backward, attention memory O(L).

Queries are taken in blocks of :data:`BLOCK` rows. Each block builds its logits against the keys it
can see (its log-prior tile from the prior, or its folded lanes when the prior folds), softmaxes and
reduces them, and keeps only its output. Under autograd each block is checkpointed: the backward
pass rebuilds one block's logits at a time, so no ``Lq x Lk`` tensor ever lives in memory, and the
gradients of every prior parameter flow through ordinary autograd.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from ..priors import Prior
from ..ssmax import Scaling
from .grouped import grouped_scores, grouped_values
from .masks import Masking
from .reference import compute_dtype, masked_softmax, prior_logits
from .sdpa import fold_qk, visible_columns

#: Query rows per block: logits of one block are ``B * H * BLOCK * Lk`` floats.
BLOCK = 128


def attend_block(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    prior: Prior | None,
    masking: Masking,
    rows: slice,
    cols: slice,
    scale: float,
    ssmax: Scaling | None,
) -> Tensor:
    """Output of query ``rows`` against key ``cols``; q, k, v arrive already sliced."""
    visible = masking.visible(rows, cols)
    if prior is not None and prior.can_fold(masking.causal):
        dtype = compute_dtype(q.dtype)
        factor = None if ssmax is None else ssmax.factor(visible.sum(-1)[:, 0])
        q2, k2, v = fold_qk(
            q.to(dtype),
            k.to(dtype),
            v,
            prior,
            masking,
            rows,
            cols,
            scale,
            factor,
            ssmax is not None and ssmax.scale_prior,
        )
        logits = grouped_scores(q2, k2)
    else:
        logits = prior_logits(q, k, prior, masking, rows, cols, scale, ssmax, visible)
    probs = masked_softmax(logits, visible)
    return grouped_values(probs, v.to(probs.dtype)).to(v.dtype)


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
    grad = torch.is_grad_enabled()
    outputs = []
    for start in range(0, q.shape[2], BLOCK):
        rows = slice(start, min(start + BLOCK, q.shape[2]))
        cols = visible_columns(masking, rows)
        args = (
            q[:, :, rows],
            k[:, :, cols],
            v[:, :, cols],
            prior,
            masking,
            rows,
            cols,
            scale,
            ssmax,
        )
        if grad:
            outputs.append(checkpoint(attend_block, *args, use_reentrant=False))
        else:
            outputs.append(attend_block(*args))
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)
