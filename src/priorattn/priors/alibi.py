"""ALiBi (Press et al., 2022): a fixed linear recency penalty per head."""

from __future__ import annotations

import torch
from torch import Tensor

from .base import (
    FoldLanes,
    Prior,
    alibi_slopes,
    key_lane_centred,
    key_linear_span,
    per_head,
    relative_positions,
)


class ALiBi(Prior):
    """``K_h(i, j) = -m_h |i - j|`` with fixed slopes ``m_h`` (a buffer, not trained).

    Under a causal mask ``-m_h (i - j) = m_h j - m_h i`` and the row constant ``-m_h i`` drops out of
    the softmax, so the prior folds into one key-linear lane (seed 000 Prop. F.6).
    """

    def __init__(self, num_heads: int, slopes: Tensor | None = None):
        super().__init__()
        slopes = alibi_slopes(num_heads) if slopes is None else torch.as_tensor(slopes)
        if slopes.shape != (num_heads,):
            raise ValueError(f"slopes must have shape ({num_heads},), got {tuple(slopes.shape)}")
        self.num_heads = num_heads
        self.register_buffer("slopes", slopes.to(torch.get_default_dtype()))

    def log_prior(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        distance = relative_positions(q_pos, k_pos, self.slopes.dtype).abs()
        return -per_head(self.slopes) * distance

    def can_fold(self, causal: bool) -> bool:
        return causal

    def fold(self, q_pos: Tensor, k_pos: Tensor) -> FoldLanes:
        dtype = self.slopes.dtype
        q = per_head(self.slopes).expand(*q_pos.shape[:-1], self.num_heads, q_pos.shape[-1], 1)
        return FoldLanes(q, key_lane_centred(q_pos, k_pos, dtype))

    def fold_span(self, dtype: torch.dtype) -> int | None:
        return key_linear_span(self.slopes, dtype)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}"
