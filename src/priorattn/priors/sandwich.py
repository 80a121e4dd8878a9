"""Sandwich (Chi et al., 2023): the position-position term of sinusoidal embeddings as a bias."""

from __future__ import annotations

import torch
from torch import Tensor

from ..checks import check_int
from .base import FoldLanes, LagPrior, PositionTable
from .math import angles, phases
from .registry import register

__all__ = ["Sandwich"]


class Sandwich(LagPrior):
    """``K_h(i, j) = (1 / r_h) sum_{k=0}^{d/2 - 1} cos((i - j) / 10000^(2k / d))``, no parameters.

    Chi, Fan, Rudnicky and Ramadge (ACL 2023), "Dissecting Transformer Length Extrapolation via the
    Lens of Receptive Field Analysis", Sec. 5: the inner product ``p_i . p_j`` of two sinusoidal
    position embeddings of width ``d`` (their ``d-bar``, 128 in their experiments) kept as a
    relative bias, divided per head by ALiBi's compression ratios ``r_h = 8 h / H``, ``h = 1 .. H``
    (their Fig. 1 caption's ``h``; attention-gym's ``sandwich`` score_mod reads the paper the same
    way). ``k`` runs from 0 as in Vaswani et al.'s embeddings, so the highest frequency is one radian
    per token.

    As a sum of cosines of ``i - j`` it is bilinear: ``cos(w (i - j)) = cos(w i) cos(w j) + sin(w i)
    sin(w j)``, ``d`` query/key lanes (seed 000 Eq. 17-18 with fixed weights ``1 / r_h``), exact under
    every mask. ``fold=True`` takes them (the ``sdpa`` route; in a layer they come out of each head's
    width); ``fold=False`` keeps every lane for content and the routes read it from a lag table
    (``memeff``, ``flex``, a decode step).
    """

    def __init__(self, num_heads: int, dim: int = 128, fold: bool = False):
        super().__init__()
        check_int("num_heads", num_heads, low=1)
        check_int("dim", dim, low=2)
        if dim % 2:
            raise ValueError(f"dim must be even (a cosine and a sine per frequency), got {dim}")
        if not isinstance(fold, bool):
            raise ValueError(f"fold must be true or false, got {fold!r}")
        self.num_heads, self.dim, self.folds = num_heads, dim, fold
        ratios = 8 * torch.arange(1, num_heads + 1, dtype=torch.float64) / num_heads  # r_h
        # float64, as ALiBi's slopes: a model's .float() rounds them, a float64 check keeps them exact
        self.register_buffer("head_scales", 1 / ratios, persistent=False)
        self.by_lag = PositionTable(self, self.of_lag)

    def freqs(self, device: torch.device) -> Tensor:
        """``w_k = 10000^(-2k / d)``, ``(d/2,)`` float64: not a buffer, so no cast can round them."""
        return 10_000.0 ** (torch.arange(0, -self.dim, -2, dtype=torch.float64, device=device) / self.dim)

    def of_lag(self, lag: Tensor) -> Tensor:
        """``K`` at lags ``d`` ``(n,)``, ``(H, n)``; the angles in float64."""
        cos = angles(lag, self.freqs(lag.device)).cos()  # (n, d/2)
        return self.head_scales[:, None] * cos.sum(-1).to(self.head_scales.dtype)

    def can_fold(self, causal: bool) -> bool:
        return self.folds

    def fold(self, q_pos: Tensor, k_pos: Tensor) -> FoldLanes:
        if not self.folds:
            raise TypeError(
                "Sandwich(fold=False) is read from a lag table, not folded: make it with fold=True"
            )
        dtype = self.head_scales.dtype
        freqs = self.freqs(q_pos.device)
        k_lanes = torch.cat(phases(k_pos, freqs), dim=-1)[..., None, :, :]  # (..., 1, Lk, d), float64
        # one set of phases where the queries' positions are the keys'
        q_lanes = k_lanes if q_pos is k_pos else torch.cat(phases(q_pos, freqs), dim=-1)[..., None, :, :]
        scales = self.head_scales[:, None, None].double()  # (H, 1, 1): 1 / r_h
        return FoldLanes((q_lanes * scales).to(dtype), k_lanes.to(dtype))

    def fold_slope(self) -> None:
        return None

    def slope_bound(self) -> float:
        return 0.0

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, dim={self.dim}, fold={self.folds}"


register(
    "sandwich",
    Sandwich,
    dim="d-bar, the sinusoidal embeddings' width: d/2 frequencies (the paper's 128)",
    fold="fold into d query/key lanes (sdpa; taken from the head in a layer); false: read from a lag table",
)
