"""The definition of scalar and hybrid attention (seed 002): every logit, then softmax.

``logits = scale <q_i, k_j> - (q_s,i - k_s,j)^2 / tau + K_h(i, j)`` (seed 002 "Attention Weights" and
"Hybrid Scalar + Dot-Product Attention"; the prior only when given), the core's masks, softmax over
keys, the weighted sum of the head's value group. A sink is one more logit, ``-(q_s,i - sink.key)^2 /
tau`` (its vector key is zero), visible to every query. Every other route is tested against this.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..functional.grouped import grouped_scores, grouped_values
from ..functional.masks import Masking
from ..functional.normalizers import masked_softmax
from ..functional.reference import compute_dtype
from ..priors import Prior


class Sink(NamedTuple):
    """A persistent key (seed 002 "Attention Sinks"): scalar ``key`` and one value per group ``(G, Dv)``."""

    key: float
    value: Tensor


def scalar_reference(
    q_s: Tensor,
    k_s: Tensor,
    v: Tensor,
    tau: Tensor,
    q: Tensor | None,
    k: Tensor | None,
    scale: float,
    prior: Prior | None,
    masking: Masking,
    sink: Sink | None,
) -> Tensor:
    """Dense scalar/hybrid attention ``(B, H, Lq, Dv)``; memory grows as ``Lq * Lk``."""
    dtype = compute_dtype(v.dtype)
    probs = scalar_weights(q_s, k_s, tau, q, k, scale, prior, masking, sink, dtype)
    out = grouped_values(probs[..., -k_s.shape[-1] :], v.to(dtype))
    if sink is not None:
        per_head = sink.value.to(dtype).repeat_interleave(q_s.shape[1] // v.shape[1], dim=0)  # (H, Dv)
        out = out + probs[..., :1] * per_head[:, None, :]
    return out.to(v.dtype)


def scalar_weights(
    q_s: Tensor,
    k_s: Tensor,
    tau: Tensor,
    q: Tensor | None,
    k: Tensor | None,
    scale: float,
    prior: Prior | None,
    masking: Masking,
    sink: Sink | None,
    dtype: torch.dtype,
) -> Tensor:
    """The attention weights ``(B, H, Lq, Lk)`` in ``dtype``, with the sink's weight first
    (``(B, H, Lq, 1 + Lk)``) when there is a sink; a query that sees nothing has zero weights."""
    q_s, k_s, tau = q_s.to(dtype), k_s.to(dtype), tau.to(dtype)
    logits = -((q_s[..., :, None] - k_s[..., None, :]) ** 2) / tau[..., None]  # (B, H, Lq, Lk)
    if q is not None:
        logits = logits + scale * grouped_scores(q.to(dtype), k.to(dtype))
    if prior is not None:
        logits = logits + prior.log_prior(masking.q_pos, masking.k_pos).to(dtype)
    visible = masking.visible().expand(logits.shape[0], 1, *logits.shape[2:])
    if sink is not None:
        sink_logit = -((q_s - sink.key) ** 2) / tau  # (B, H, Lq)
        logits = torch.cat([sink_logit[..., None], logits], dim=-1)
        visible = torch.cat([visible.new_ones(*visible.shape[:-1], 1), visible], dim=-1)
    return masked_softmax(logits, visible)
