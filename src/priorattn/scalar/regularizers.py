"""Regularization for efficient inference (seed 002 "Regularization for Efficient Inference").

- ``L_align`` (Term 1): ``sum_j stopgrad(w_ij) (q_s,i - k_s,j)^2``, the attention-weighted squared
  scalar distance, averaged over queries and heads. The seed writes ``(1/n^2) sum_q sum_k``; here
  each query's weights sum to one and the mean is over queries, so the term does not shrink as
  ``1/n`` with the context (a constant factor ``n`` in its weight at a fixed length). It is never
  built as an ``Lq x Lk`` matrix: expanding the square, ``sum_j w_ij (q_i - k_j)^2 = q_i^2 sum_j w_ij
  - 2 q_i sum_j w_ij k_j + sum_j w_ij k_j^2``, and the two sums are the output of the same attention
  over the values ``[k_j, k_j^2]`` (:func:`align_values`), with the score's inputs detached so that the
  gradient reaches the scalar projections through these values and ``q_i`` only, never the weights.
- ``L_spread`` (Term 2): sorted keys against uniform quantile targets ``linspace(a, b, n)`` per
  sequence and head, over a fixed range or the adaptive ``mean +- 3 std`` (a detached target); the
  gradient flows through the key values, not the sort order.
- ``L_tau`` (Term 3): ``sum_heads log(1 + tau_h)`` (per-token tau: averaged over tokens).

The layers compute the terms (:class:`~priorattn.scalar.ScalarMultiheadAttention`); a model's
:class:`~priorattn.scalar.model.Regularizer` weighs them as its auxiliary training losses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .fold import key_lanes

TERMS = ("align", "spread", "tau")


def align_values(k_s: Tensor, groups: int) -> Tensor:
    """Values ``(B, G, Lk, 2m + 1)`` whose attention output holds, for head ``r`` of a group, ``sum_j
    w_ij k_j`` and ``sum_j w_ij k_j^2`` in lanes ``2r, 2r + 1`` and ``sum_j w_ij`` in the last."""
    lanes = key_lanes(k_s, groups)
    return torch.cat([lanes, lanes.new_ones(*lanes.shape[:-1], 1)], dim=-1)


def align_from_moments(q_s: Tensor, moments: Tensor) -> Tensor:
    """``L_align`` from ``q_s (B, H, Lq)`` and the attention output over :func:`align_values`,
    ``(B, H, Lq, 2m + 1)``: the mean over queries and heads of ``sum_j w_ij (q_i - k_j)^2``."""
    B, H, Lq = q_s.shape
    m = (moments.shape[-1] - 1) // 2
    own = torch.arange(H, device=q_s.device) % m  # head r of its group reads lanes 2r, 2r + 1
    first = moments[..., :-1].gather(-1, (2 * own)[None, :, None, None].expand(B, H, Lq, 1))[..., 0]
    second = moments[..., :-1].gather(-1, (2 * own + 1)[None, :, None, None].expand(B, H, Lq, 1))[..., 0]
    mass = moments[..., -1]  # 1, or 0 for a query that sees no key
    return (q_s * q_s * mass - 2 * q_s * first + second).mean()


def spread_loss(k_s: Tensor, value_range: tuple[float, float] | None) -> Tensor:
    """``L_spread`` of keys ``(B, H, L)``: mean squared distance of the sorted keys of each sequence and
    head to ``linspace(a, b, L)``; ``value_range=None`` takes ``mean +- 3 std`` of those keys."""
    ordered = k_s.sort(dim=-1).values  # the gradient reaches each key at its sorted place
    L = k_s.shape[-1]
    unit = torch.linspace(0.0, 1.0, L, dtype=k_s.dtype, device=k_s.device)
    if value_range is None:
        detached = k_s.detach()
        mean = detached.mean(-1, keepdim=True)
        std = detached.std(-1, keepdim=True) if L > 1 else torch.zeros_like(mean)
        low, high = mean - 3 * std, mean + 3 * std
    else:
        low, high = value_range
    targets = low + (high - low) * unit
    return ((ordered - targets) ** 2).mean()


def tau_loss(tau: Tensor) -> Tensor:
    """``L_tau = sum_h log(1 + tau_h)`` for ``tau (H,)``, averaged over tokens for ``(B, H, L)``."""
    per_head = torch.log1p(tau)
    return per_head.sum() if per_head.dim() == 1 else per_head.sum(1).mean()


@dataclass
class Regularization:
    """Weights and start steps of the three terms (seed 002 "Complete Regularizer"): ``L_reg =
    align * L_align + spread * L_spread + tau * L_tau``, each term on from its start step (seed
    002 tuning notes: "introduce lambda_spread after initial convergence"). ``spread_range``:
    ``(a, b)`` or ``None`` for the adaptive range."""

    align: float = 0.0
    spread: float = 0.0
    tau: float = 0.0
    align_start: int = 0
    spread_start: int = 0
    tau_start: int = 0
    spread_range: tuple[float, float] | None = (-3.0, 3.0)

    def __post_init__(self):
        for name in TERMS:
            weight = getattr(self, name)
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight >= 0:
                raise ValueError(f"the {name} regularizer weight must be a number >= 0, got {weight!r}")
            start = getattr(self, f"{name}_start")
            if isinstance(start, bool) or not isinstance(start, int) or start < 0:
                raise ValueError(f"{name}_start must be an int >= 0 (a step), got {start!r}")
        if self.spread_range is not None:
            a, b = self.spread_range
            if not a < b:
                raise ValueError(f"spread_range must be (a, b) with a < b, got {self.spread_range!r}")
            self.spread_range = (float(a), float(b))

    def weights(self, step: int) -> dict[str, float]:
        """The weight of each term at optimizer ``step`` (0 before its start)."""
        return {
            name: getattr(self, name) if step >= getattr(self, f"{name}_start") else 0.0 for name in TERMS
        }

    @property
    def active(self) -> bool:
        return any(getattr(self, name) > 0 for name in TERMS)
