"""ALiBi (Press et al., 2022): a fixed linear recency penalty per head."""

from __future__ import annotations

import torch
from torch import Tensor

from ..checks import check_int
from .base import FoldLanes, LagPrior, PositionTable
from .math import alibi_slopes, per_head, relative_positions
from .registry import register

__all__ = ["ALiBi"]


class ALiBi(LagPrior):
    """``K_h(i, j) = -m_h |i - j|`` with fixed slopes ``m_h`` (a buffer, not trained).

    The slopes are set at construction or by ``load_state_dict``, which also record their largest
    magnitude (:meth:`slope_bound`); an in-place edit of the buffer leaves that record behind.

    Under a causal mask ``-m_h (i - j) = m_h j - m_h i`` and the row constant ``-m_h i`` drops out of
    the softmax, so the prior folds into one key-linear lane (seed 000 Prop. F.6).
    """

    def __init__(self, num_heads: int, slopes: Tensor | None = None):
        super().__init__()
        check_int("num_heads", num_heads, low=1)
        slopes = alibi_slopes(num_heads) if slopes is None else torch.as_tensor(slopes)
        if slopes.shape != (num_heads,):
            raise ValueError(f"slopes must have shape ({num_heads},), got {tuple(slopes.shape)}")
        self.num_heads = num_heads
        # Floating slopes keep their precision (float64 slopes for exact checks); others are cast.
        self.register_buffer(
            "slopes", slopes if slopes.is_floating_point() else slopes.to(torch.get_default_dtype())
        )
        self.largest_slope = float(self.slopes.detach().abs().max())  # read once, where they are made
        self.by_lag = PositionTable(self, self.of_lag)

    def log_prior(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """Evaluated, not read from the lag table: one product per cell, exact at any lag."""
        distance = relative_positions(q_pos, k_pos, self.slopes.dtype).abs()
        return -per_head(self.slopes) * distance

    def of_lag(self, lag: Tensor) -> Tensor:
        """``-m_h |d|`` at lags ``d`` ``(n,)``, ``(H, n)``."""
        return -self.slopes[:, None] * lag.to(self.slopes.dtype).abs()

    def can_fold(self, causal: bool) -> bool:
        return causal

    def fold(self, q_pos: Tensor, k_pos: Tensor) -> FoldLanes:
        # Prop. F.6: -m (i - j) = m j + row constant; no bilinear lanes at all.
        empty = self.slopes.new_zeros(1, q_pos.shape[-1], 0)
        return FoldLanes(empty, self.slopes.new_zeros(1, k_pos.shape[-1], 0), slope=self.slopes)

    def fold_slope(self) -> Tensor:
        return self.slopes

    def slope_bound(self) -> float:
        return self.largest_slope

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        slopes = state_dict.get(prefix + "slopes")
        if slopes is not None:  # read once per load, not per call
            self.largest_slope = float(slopes.detach().abs().max())

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}"


register("alibi", ALiBi)  # its slopes are a buffer: a checkpoint holds them
