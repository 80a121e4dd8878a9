"""The definition of prior attention: materialize every logit, then softmax.

``logits[b,h,i,j] = scale * <q_i, k_j> + K_h(q_pos[i], k_pos[j]) + key_bias[b,h,j]`` (seed 000 Eq. 11
and 23: the log-prior is added unscaled; the op's per-key term joins it); with SSMax the logits of
query i are multiplied by ``s_h log n_i`` (the log-prior too when ``SSMax.scale_prior``); then the
masks, softmax over keys, and the weighted sum of values. A query that sees no key returns zeros.
Every other route is tested against this one. It is also the only route for normalizers other than
softmax (sparsemax, entmax; seed 004 Sec. 4).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..priors import Prior
from ..ssmax import Scaling
from .grouped import grouped_scores, grouped_values
from .masks import Masking
from .normalizers import masked_softmax


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Logits and softmax run in float32 for half-precision inputs."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def prior_logits(
    q: Tensor,
    k: Tensor,
    log_prior: Tensor | None,
    scale: float,
    ssmax: Scaling | None,
    visible: Tensor,
    gate: Tensor | None = None,
) -> Tensor:
    """Logits ``(B, H, lq, lk)`` of (already sliced) queries against keys, plus their log-prior tile
    times the prior's query ``gate`` ``(B, H, lq, 1)`` where it has one."""
    dtype = compute_dtype(q.dtype)
    content = scale * grouped_scores(q.to(dtype), k.to(dtype))
    if log_prior is not None:
        log_prior = log_prior.to(dtype)
        if gate is not None:
            log_prior = log_prior * gate.to(dtype)
    if ssmax is not None:
        factor = ssmax.factor(visible.sum(-1)[:, 0]).to(dtype)
        content = content * factor
        if log_prior is not None and ssmax.scale_prior:
            log_prior = log_prior * factor
    return content if log_prior is None else content + log_prior


def reference_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    prior: Prior | None,
    masking: Masking,
    scale: float,
    ssmax: Scaling | None,
    key_bias: Tensor | None = None,
    normalize: Callable[[Tensor, Tensor], Tensor] = masked_softmax,
) -> Tensor:
    """Dense prior attention: ``(B, H, Lq, Dv)``. Memory grows as ``Lq * Lk``.

    ``normalize(logits, visible)`` maps logits to weights over the keys: softmax, or another map of
    the variational family (:func:`priorattn.eot.regularizer`), with zeros at masked keys.
    ``key_bias`` ``(B or 1, H or 1, Lk)`` joins every query's row of the log-prior, which the prior's
    query gate (:meth:`~priorattn.priors.Prior.query_gate`) then multiplies.
    """
    visible = masking.visible()
    log_prior = None if prior is None else prior.log_prior(masking.q_pos, masking.k_pos)
    if key_bias is not None:
        row = key_bias[..., None, :].to(compute_dtype(q.dtype))  # (B or 1, H or 1, 1, Lk)
        log_prior = row if log_prior is None else log_prior + row
    gate = None if prior is None else prior.query_gate(q)
    logits = prior_logits(q, k, log_prior, scale, ssmax, visible, gate)
    probs = normalize(logits, visible)
    return grouped_values(probs, v.to(probs.dtype)).to(v.dtype)
