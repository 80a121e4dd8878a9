"""Scalable-Softmax (SSMax, Nakanishi 2025; seed 003 Section 2.5)."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor, nn

from .checks import check_int


class Scaling(NamedTuple):
    """The SSMax of one attention call: per-head scales ``s`` ``(H,)`` and whether K is scaled too."""

    s: Tensor
    scale_prior: bool

    def factor(self, visible_keys: Tensor) -> Tensor:
        """``s_h * log(n_i)`` as ``(..., H, Lq, 1)`` from visible-key counts ``(..., Lq)``.

        A query with no visible key gets ``log 1 = 0``; its output is zero anyway.
        """
        log_n = visible_keys.clamp(min=1).to(self.s.dtype).log()
        return (self.s[:, None] * log_n[..., None, :])[..., None]


class SSMax(nn.Module):
    """Learnable per-head SSMax scale: the logits of query i are multiplied by ``s_h * log(n_i)``.

    ``n_i`` is the number of keys query i can see (within its document), so attention keeps its
    sharpness as the context grows instead of fading towards uniform. ``scale_prior`` decides whether
    the log-prior is scaled along with the content score (the default) or added after scaling.
    ``s`` starts at ``init`` (1.0, as BAM's code starts it).
    """

    def __init__(self, num_heads: int, init: float = 1.0, scale_prior: bool = True):
        super().__init__()
        check_int("num_heads", num_heads, low=1)
        if isinstance(init, bool) or not (isinstance(init, int | float) and math.isfinite(init)):
            raise ValueError(f"init must be a finite number, got {init!r}")
        self.num_heads = num_heads
        self.scale_prior = scale_prior
        self.s = nn.Parameter(torch.full((num_heads,), float(init)))

    def scaling(self) -> Scaling:
        return Scaling(self.s, self.scale_prior)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, scale_prior={self.scale_prior}"
