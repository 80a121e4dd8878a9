"""Measures of attention rows that the seeds' theorems are stated in (checked in ``tests/theory``,
verdicts in docs/theory.md).

Every function works over the last dim (the keys) of ``(..., Lk)`` tensors, with ``visible``
``(..., Lk)`` bool (broadcasting; None: every key) marking the keys a query sees; every row needs one.

- :func:`content_range`: ``omega_i = max_k s_ik - min_k s_ik``, the dynamic range of the content
  scores (seed 000 Thm. 5.1): ``pi_ij exp(-omega_i) <= p_ij <= pi_ij exp(omega_i)``.
- :func:`sink_margin`: ``delta_i = min_{k != sink} (K_i,sink - K_ik)``, the prior's margin for a
  sink key (seed 000 Def. 5.2, Thm. 5.4).
- :func:`context_sensitivity`: ``Psi_i = 1 - p_i,sink``, the weight on every other key, which
  bounds how far the output moves when their values move (seed 000 Def. 5.3, Eq. 28-29).
- :func:`sensitivity_bound`: ``(n - 1) / (exp(delta - omega) + n - 1) >= Psi`` for a row with ``n``
  visible keys: seed 000 Eq. 31 at ``omega = 0``, and the same argument at any content range.
- :func:`content_position_log_z`: ``log Z = log Z_cont + log Z_pos - log Z_joint``, the normalizer
  that makes content and position factorize (seed 003 Thm. 1, App. I), which App. I.3 calls the
  mutual information ``I(cont; pos)``; it is ``-log <softmax(f), softmax(g)>``, see the function.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _visible(x: Tensor, visible: Tensor | None) -> Tensor:
    visible = torch.ones_like(x, dtype=torch.bool) if visible is None else visible.expand_as(x)
    if not visible.any(-1).all():
        raise ValueError("every row needs at least one visible key")
    return visible


def content_range(scores: Tensor, visible: Tensor | None = None) -> Tensor:
    """``(...,)``: ``max - min`` of the content scores ``(..., Lk)`` over the visible keys."""
    visible = _visible(scores, visible)
    top = scores.masked_fill(~visible, -math.inf).amax(-1)
    bottom = scores.masked_fill(~visible, math.inf).amin(-1)
    return top - bottom


def _sink_index(sink: int | Tensor, rows: torch.Size, keys: int) -> Tensor:
    """``(..., 1)`` long index of each row's sink key."""
    sink = torch.as_tensor(sink, dtype=torch.long)
    if ((sink < 0) | (sink >= keys)).any():
        raise ValueError(f"sink must index one of the {keys} keys, got {sink.tolist()}")
    return sink.expand(rows)[..., None]


def sink_margin(log_prior: Tensor, sink: int | Tensor, visible: Tensor | None = None) -> Tensor:
    """``(...,)``: ``min_{k != sink, visible} (K[..., sink] - K[..., k])`` (seed 000 Thm. 5.4).

    ``sink``: the sink's key index, one for every row or ``(...,)`` per row; it must be visible.
    A row whose only visible key is the sink has margin ``inf`` (no other key to beat).
    """
    visible = _visible(log_prior, visible)
    index = _sink_index(sink, log_prior.shape[:-1], log_prior.shape[-1])
    if not visible.gather(-1, index).all():
        raise ValueError("the sink key must be visible in every row")
    others = visible.scatter(-1, index, False)
    best_other = log_prior.masked_fill(~others, -math.inf).amax(-1)
    return log_prior.gather(-1, index)[..., 0] - best_other


def context_sensitivity(weights: Tensor, sink: int | Tensor) -> Tensor:
    """``(...,)``: ``Psi = 1 - weights[..., sink]``, the attention on every key but the sink (Eq. 28)."""
    index = _sink_index(sink, weights.shape[:-1], weights.shape[-1])
    return 1 - weights.gather(-1, index)[..., 0]


def sensitivity_bound(margin: Tensor, keys: Tensor, omega: Tensor | float = 0.0) -> Tensor:
    """``(n - 1) / (exp(delta - omega) + n - 1)``, an upper bound on ``Psi`` for a row with ``keys = n``
    visible keys, prior margin ``delta`` for the sink and content range ``omega``.

    Every other key's logit is at least ``delta - omega`` below the sink's, so the sink's weight is
    ``1 / (1 + sum_k exp(z_k - z_sink)) >= 1 / (1 + (n - 1) exp(omega - delta))`` (seed 000 Eq. 55-59,
    there with ``omega -> 0``). Equality when every other key's logit is exactly ``delta - omega``
    below the sink's.
    """
    margin, keys = torch.as_tensor(margin), torch.as_tensor(keys)
    others = (keys - 1).to(margin.dtype)
    # (n - 1) / (exp(x) + n - 1) = 1 / (1 + exp(x - log(n - 1))), written so that no term overflows
    return torch.where(others > 0, torch.sigmoid(torch.log(others) - (margin - omega)), 0.0)


def content_position_log_z(content: Tensor, log_prior: Tensor, visible: Tensor | None = None) -> Tensor:
    """``(...,)``: ``log Z = log Z_cont + log Z_pos - log Z_joint`` over the visible keys (seed 003 App. I.1),
    with ``Z_cont = sum_j exp(f_j)``, ``Z_pos = sum_j exp(g_j)``, ``Z_joint = sum_j exp(f_j + g_j)``
    for content scores ``f`` and log-prior ``g`` (broadcasting against each other).

    Then ``softmax(f + g) = Z * softmax(f) * softmax(g)`` (seed 003 Thm. 1, with Thm. 1's ``Z`` the
    reciprocal of this one) and ``log Z = -log <softmax(f), softmax(g)>``: the collision cross-entropy
    of the content and position distributions. App. I.3 names it the mutual information
    ``I(cont; pos)``; it is not one: a uniform prior (no positional information) gives
    ``log Z = log n`` whatever the content, and ``log Z = 0`` only when both distributions are the same
    single key (docs/theory.md).
    """
    content, log_prior = torch.broadcast_tensors(content, log_prior)
    visible = _visible(content, visible)

    def log_partition(x: Tensor) -> Tensor:
        return torch.logsumexp(x.masked_fill(~visible, -math.inf), dim=-1)

    return log_partition(content) + log_partition(log_prior) - log_partition(content + log_prior)
