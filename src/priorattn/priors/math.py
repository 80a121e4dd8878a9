"""The math several priors share: lags, ALiBi's slopes, sinusoidal phases, softplus and its inverse.

One place for each formula, so that two priors computing the same term compute it the same way
(angles in float64, the inverse softplus that does not overflow).
"""

from __future__ import annotations

import torch
from torch import Tensor


def pairwise_lags(q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """``d = q_pos[i] - k_pos[j]`` ``(..., Lq, Lk)`` for integer positions ``(..., Lq)`` and ``(..., Lk)``."""
    return q_pos[..., :, None] - k_pos[..., None, :]


def relative_positions(q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype) -> Tensor:
    """:func:`pairwise_lags` as ``(..., 1, Lq, Lk)`` in ``dtype`` (exact: the difference is integer), to
    broadcast against ``(..., H, Lq, Lk)``."""
    return pairwise_lags(q_pos, k_pos).to(dtype).unsqueeze(-3)


def per_head(param: Tensor) -> Tensor:
    """``(H,)`` -> ``(H, 1, 1)``, to broadcast against ``(..., H, Lq, Lk)``."""
    return param[:, None, None]


def alibi_slopes(num_heads: int) -> Tensor:
    """The standard ALiBi head slopes: a geometric sequence ``2^(-8/n), 2^(-16/n), ...``, float64.

    For a head count that is not a power of two, the first ``2^floor(log2 H)`` slopes are followed by
    every other slope of the next power of two (Press et al., 2022).
    """
    if num_heads < 1:
        raise ValueError(f"num_heads must be >= 1, got {num_heads}")

    def geometric(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    power = 1 << (num_heads.bit_length() - 1)
    slopes = geometric(power)
    if power < num_heads:
        slopes += geometric(2 * power)[0::2][: num_heads - power]
    return torch.tensor(slopes, dtype=torch.float64)


def geometric_freqs(num_freqs: int, base: float) -> Tensor:
    """``w_r = base^(-r / (R - 1))``, r = 0..R-1, float64: from one radian per token down to ``1 / base``."""
    return base ** (-torch.arange(num_freqs, dtype=torch.float64) / max(num_freqs - 1, 1))


def angles(pos: Tensor, freqs: Tensor) -> Tensor:
    """``w_r * pos`` ``(..., L, R)`` in float64 for positions ``(..., L)``: at position 10^5 a float32
    angle is off by ~0.01 rad. One product: it widens integer positions itself."""
    return pos[..., None] * freqs.to(torch.float64)


def phases(pos: Tensor, freqs: Tensor) -> tuple[Tensor, Tensor]:
    """``cos(w_r * pos)`` and ``sin(w_r * pos)``, ``(..., L, R)``, in ``freqs.dtype``; the angles in
    float64 (:func:`angles`)."""
    angle = angles(pos, freqs)
    return angle.cos().to(freqs.dtype), angle.sin().to(freqs.dtype)


def inverse_softplus(m: Tensor) -> Tensor:
    """``x`` with ``softplus(x) = m`` for ``m > 0``: ``log(expm1(m))``, computed as ``m +
    log(-expm1(-m))``, which does not overflow where ``expm1(m)`` would."""
    return m + torch.log(-torch.expm1(-m))
