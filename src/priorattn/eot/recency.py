"""The maximum-entropy recency prior (seed 000 App. F.3, Thm. 3).

Among distributions over the lags ``d = 0, ..., L - 1`` with mean lag ``mu``, the one of largest
entropy is ``q_d = exp(-lambda d) / sum_t exp(-lambda t)`` (Eq. 93), with the one ``lambda`` that
gives mean ``mu``. Its log is ``-lambda d`` up to a constant: under a causal mask, ALiBi with slope
``lambda`` (Prop. F.6). So :func:`maxent_recency_rate` is the ALiBi / GOAT slope whose prior over a
window of ``L`` keys has mean lag ``mu``.
"""

from __future__ import annotations

import torch
from torch import Tensor

#: Bisection halvings: from a bracket of width 2^11 down to far below float64 resolution of lambda.
BISECTIONS = 200


def _check(mean: float, num_lags: int) -> None:
    if isinstance(num_lags, bool) or not isinstance(num_lags, int) or num_lags < 2:
        raise ValueError(f"num_lags must be an int >= 2 (lags 0 .. num_lags - 1), got {num_lags!r}")
    if isinstance(mean, bool) or not isinstance(mean, int | float) or not 0 < mean < num_lags - 1:
        raise ValueError(
            f"mean must lie strictly between 0 and num_lags - 1 = {num_lags - 1} (Thm. 3), got {mean!r}"
        )


def recency_prior(rate: float, num_lags: int) -> Tensor:
    """``(num_lags,)`` float64: ``q_d`` proportional to ``exp(-rate * d)`` (Eq. 93)."""
    lags = torch.arange(num_lags, dtype=torch.float64)
    return torch.softmax(-rate * lags, dim=0)


def mean_lag(q: Tensor) -> Tensor:
    """``sum_d d q_d`` over the last dim."""
    return (q * torch.arange(q.shape[-1], dtype=q.dtype)).sum(-1)


def maxent_recency_rate(mean: float, num_lags: int) -> float:
    """The ``lambda`` of Thm. 3: ``recency_prior(lambda, num_lags)`` has mean lag ``mean``.

    The mean falls strictly as ``lambda`` grows (Eq. 100: its derivative is minus the variance), from
    ``L - 1`` to 0, so bisection finds the one root. ``lambda < 0`` when the mean is past the middle
    lag (a prior that prefers distant keys).
    """
    _check(mean, num_lags)

    def too_far(rate: float) -> bool:
        return mean_lag(recency_prior(rate, num_lags)).item() > mean

    low, high = -1.0, 1.0
    while too_far(high):
        high *= 2
    while not too_far(low):
        low *= 2
    for _ in range(BISECTIONS):
        middle = (low + high) / 2
        if middle in (low, high):
            break
        low, high = (middle, high) if too_far(middle) else (low, middle)
    return (low + high) / 2


def maxent_recency(mean: float, num_lags: int) -> Tensor:
    """``(num_lags,)`` float64: the maximum-entropy distribution over lags ``0 .. num_lags - 1`` with
    mean lag ``mean`` (seed 000 Thm. 3, Eq. 93)."""
    return recency_prior(maxent_recency_rate(mean, num_lags), num_lags)
