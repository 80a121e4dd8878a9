"""T5's relative position bias (Raffel et al., 2020, Sec. 2.1): a learned scalar per head and
log-spaced distance bucket."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..checks import check_int
from .base import LagPrior, PositionTable
from .registry import register

__all__ = ["T5Bias"]


class T5Bias(LagPrior):
    """``K_h(i, j) = b_h[bucket(i - j)]``: one learned scalar per head per distance bucket.

    Raffel et al. (2020, Sec. 2.1) learn one table and share it across layers (``shared_prior``
    does that in the library's GPT). The buckets are those of their released code
    (``relative_position_bucket`` of mesh-tensorflow and HF transformers), for a distance ``n``:

    - ``n < max_exact = buckets // 2``: bucket ``n`` (one bucket per distance);
    - else ``max_exact + floor(log(n / max_exact) / log(max_distance / max_exact) * (buckets -
      max_exact))``, at most ``buckets - 1``: logarithmically wider buckets up to ``max_distance``,
      and every farther distance in the last one.

    Causal (``bidirectional=False``, a decoder's): ``n = max(i - j, 0)`` over all ``num_buckets``;
    a key after its query shares bucket 0 with ``i = j`` (it is masked in causal attention).
    Bidirectional (an encoder's): half of the buckets for keys at or before the query (``n = i - j``),
    the other half, offset by ``num_buckets // 2``, for keys after it (``n = j - i``).

    Bucket indices are computed in float64 (HF transformers in float32: at the default options the
    two agree at every distance below 200000). The biases start at 0, standard attention (T5 starts
    them at random).
    """

    def __init__(
        self, num_heads: int, num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = False
    ):
        super().__init__()
        check_int("num_heads", num_heads, low=1)
        if not isinstance(bidirectional, bool):
            raise ValueError(f"bidirectional must be true or false, got {bidirectional!r}")
        check_int("num_buckets", num_buckets, low=4 if bidirectional else 2)
        if bidirectional and num_buckets % 2:
            raise ValueError(
                f"num_buckets must be even when bidirectional (half per side), got {num_buckets}"
            )
        self.per_side = num_buckets // 2 if bidirectional else num_buckets
        self.max_exact = self.per_side // 2
        check_int("max_distance", max_distance, low=self.max_exact + 1)
        self.num_heads = num_heads
        self.num_buckets, self.max_distance, self.bidirectional = num_buckets, max_distance, bidirectional
        self.bias = nn.Parameter(torch.zeros(num_heads, num_buckets, dtype=torch.get_default_dtype()))
        # The bucket of every lag in [-max_distance, max_distance] (of 0 .. max_distance when causal);
        # every farther lag shares its side's last. A call reads its lags' buckets from it in one
        # gather. It depends on the options alone, so it never goes stale.
        self.first_lag = -max_distance if bidirectional else 0
        lags = torch.arange(self.first_lag, max_distance + 1)
        self.register_buffer("buckets", self.bucket(lags), persistent=False)
        self.by_lag = PositionTable(self, self.of_lag)

    def constant_beyond(self) -> int:
        """The first distance in the last bucket of keys at or before the query: every farther one
        shares it (``bucket`` is non-decreasing in the distance, and ``max_distance`` is in it)."""
        distances = torch.arange(self.max_distance + 1)
        return int((self.bucket(distances) < self.per_side - 1).sum())

    def bucket(self, lag: Tensor) -> Tensor:
        """The bucket of each lag ``d = i - j`` (any integer shape), as int64 of the same shape."""
        lag = lag.long()
        if self.bidirectional:
            offset = (lag < 0).long() * self.per_side  # keys after the query: the second half
            n = lag.abs()
        else:
            offset, n = 0, lag.clamp(min=0)
        # log-spaced buckets beyond max_exact (n clamped so that log never sees 0), in the order of
        # operations of the released code: at lags where the product is an integer (64 of 128) it
        # rounds to the same bucket
        far = (n.clamp(min=self.max_exact).double() / self.max_exact).log()
        ratio = math.log(self.max_distance / self.max_exact)
        wide = self.max_exact + (far / ratio * (self.per_side - self.max_exact)).long()
        return offset + torch.where(n < self.max_exact, n, wide.clamp(max=self.per_side - 1))

    def of_lag(self, lag: Tensor) -> Tensor:
        """``b_h[bucket(d)]`` at lags ``d`` ``(n,)``, ``(H, n)``."""
        index = lag.clamp(self.first_lag, self.max_distance)
        if self.first_lag:
            index = index - self.first_lag
        return self.bias.index_select(1, self.buckets.index_select(0, index))

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, num_buckets={self.num_buckets}, "
            f"max_distance={self.max_distance}, bidirectional={self.bidirectional}"
        )


register(
    "t5",
    T5Bias,
    num_buckets="distance buckets (per head; half per side when bidirectional)",
    max_distance="distances from here on share the last bucket",
    bidirectional="separate buckets for keys after the query (an encoder's); false: a decoder's",
)
