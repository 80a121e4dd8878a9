"""The contract every prior follows.

A prior is a small ``nn.Module`` that knows its log-prior ``K_h(i, j)`` over query and key positions.
Attention routes ask it for what they need:

- ``log_prior(q_pos, k_pos)``: the dense definition, ``(..., H, Lq, Lk)``. Every route is tested
  against it.
- ``fold(q_pos, k_pos)``: extra q/k lanes whose inner product reproduces the log-prior up to a
  per-query constant (softmax ignores those), so one unmodified SDPA call can apply it
  (seed 000 Eq. 17-24). Only priors with ``can_fold(causal)`` true implement it.

A prior never knows about routes, masks, caches or models.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn


class FoldLanes(NamedTuple):
    """Lanes that fold a log-prior into q/k: ``<q[..., h, i, :], k[..., h', j, :]> = K_h(i, j) + c_hi``.

    ``q``: ``(..., H, Lq, P)``. ``k``: ``(..., Hk, Lk, P)`` with ``Hk`` either 1 (the same key lanes
    for every head, so grouped-query attention keeps its shared keys) or ``H``.
    """

    q: Tensor
    k: Tensor


class Prior(nn.Module):
    """Base class: a learnable log-prior over (query position, key position)."""

    #: Number of heads the prior has parameters for; ``None`` means the same for every head.
    num_heads: int | None = None

    def log_prior(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """Dense log-prior ``(..., H, Lq, Lk)`` for integer positions ``(..., Lq)`` and ``(..., Lk)``."""
        raise NotImplementedError

    def can_fold(self, causal: bool) -> bool:
        """Whether :meth:`fold` is exact (up to per-query constants) under this masking."""
        return False

    def fold(self, q_pos: Tensor, k_pos: Tensor) -> FoldLanes:
        """Lanes to append to q and k; see :class:`FoldLanes`."""
        raise TypeError(f"{type(self).__name__} cannot be folded into q/k lanes")

    @property
    def fold_width(self) -> int:
        """Number of lanes :meth:`fold` appends to q and k."""
        origin = torch.zeros(1, dtype=torch.long)
        return self.fold(origin, origin).q.shape[-1]

    def fold_span(self, dtype: torch.dtype) -> int | None:
        """Longest run of queries one folded call may cover and stay exact in ``dtype``.

        Lanes that grow with the key position (a key-linear slope) are re-centred on the queries of
        each call; their magnitude over a run of ``n`` queries is ``slope * n``, which must stay small
        next to the unit roundoff of ``dtype``. ``None``: no limit.
        """
        return None

    def check_finite(self) -> None:
        """Raise a ``ValueError`` naming the first parameter that holds NaN or inf."""
        for name, p in self.named_parameters():
            if not torch.isfinite(p).all():
                raise ValueError(f"{type(self).__name__}.{name} has non-finite values")


def relative_positions(q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype) -> Tensor:
    """``q_pos[i] - k_pos[j]`` as ``(..., 1, Lq, Lk)`` in ``dtype`` (exact: the difference is integer)."""
    return (q_pos[..., :, None] - k_pos[..., None, :]).to(dtype).unsqueeze(-3)


def per_head(param: Tensor) -> Tensor:
    """``(H,)`` -> ``(H, 1, 1)``, to broadcast against ``(..., H, Lq, Lk)``."""
    return param[:, None, None]


def alibi_slopes(num_heads: int) -> Tensor:
    """The standard ALiBi head slopes: a geometric sequence ``2^(-8/n), 2^(-16/n), ...``.

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


#: Largest magnitude a key-linear lane may reach inside one folded call, per dtype; past it the
#: rounding of ``slope * (j - centre)`` shows in the logits (measured: tests/attention/test_sdpa.py).
FOLD_MAGNITUDE = {
    torch.float64: 2.0**30,
    torch.float32: 2.0**8,
    torch.bfloat16: 2.0**0,
    torch.float16: 2.0**2,
}


def key_linear_span(slopes: Tensor, dtype: torch.dtype) -> int | None:
    """:meth:`Prior.fold_span` for a prior with key-linear lanes of the given slopes."""
    largest = float(slopes.detach().abs().max()) if slopes.numel() else 0.0
    if largest == 0.0:
        return None
    return max(1, int(FOLD_MAGNITUDE.get(dtype, FOLD_MAGNITUDE[torch.float32]) / largest))


def key_lane_centred(q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype) -> Tensor:
    """``k_pos[j] - max_i q_pos[i]`` as ``(..., 1, Lk, 1)``: a key-linear lane re-centred on the queries.

    Re-centring adds a per-query constant (softmax ignores it) and keeps the lane small for the keys
    that matter, so ``slope * lane`` does not swamp the content score in floating point.
    """
    centre = q_pos.amax(dim=-1, keepdim=True)
    return (k_pos - centre).to(dtype)[..., None, :, None]


def concat_lanes(parts: list[FoldLanes]) -> FoldLanes:
    """Concatenate the lanes of several folded priors (their inner products add)."""
    q = torch.broadcast_tensors(*[p.q[..., :1] for p in parts])[0].shape[:-1]
    k = torch.broadcast_tensors(*[p.k[..., :1] for p in parts])[0].shape[:-1]
    return FoldLanes(
        torch.cat([p.q.expand(*q, p.q.shape[-1]) for p in parts], dim=-1),
        torch.cat([p.k.expand(*k, p.k.shape[-1]) for p in parts], dim=-1),
    )
