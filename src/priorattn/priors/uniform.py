"""NoPE: the implicit uniform prior of standard attention (seed 000 Eq. 3)."""

from __future__ import annotations

import torch
from torch import Tensor

from .base import FoldLanes, Prior
from .registry import register

__all__ = ["Uniform"]


class Uniform(Prior):
    """``K(i, j) = 0``: standard attention, no positional information."""

    @property
    def is_relative(self) -> bool:
        return True

    def log_prior(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        shape = (*q_pos.shape[:-1], 1, q_pos.shape[-1], k_pos.shape[-1])
        return torch.zeros(shape, dtype=torch.get_default_dtype(), device=q_pos.device)

    def can_fold(self, causal: bool) -> bool:
        return True

    def fold(self, q_pos: Tensor, k_pos: Tensor) -> FoldLanes:
        empty = dict(dtype=torch.get_default_dtype(), device=q_pos.device)
        return FoldLanes(
            torch.zeros(1, q_pos.shape[-1], 0, **empty), torch.zeros(1, k_pos.shape[-1], 0, **empty)
        )


register("uniform", Uniform)
