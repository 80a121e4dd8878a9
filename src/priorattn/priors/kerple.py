"""KERPLE (Chi et al., 2022): relative positions through conditionally positive definite kernels."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checks import check_int
from .base import LagPrior, PositionTable
from .math import inverse_softplus
from .registry import register

__all__ = ["KERPLE"]

VARIANTS = ("log", "power")


class KERPLE(LagPrior):
    """``K_h(i, j) = -r1_h log(1 + r2_h |i - j|)`` (``variant="log"``) or ``-r1_h |i - j|^r2_h``
    (``variant="power"``), with learnable ``r1_h, r2_h > 0`` per head and ``r2_h <= 2`` for the power.

    Chi et al. (2022), "KERPLE: Kernelized Relative Positional Embedding for Length Extrapolation",
    Sec. 4, its power and logarithmic variants: a conditionally positive definite kernel of ``i - j``,
    made positive definite by a constant shift that the softmax drops.

    The constraints hold by parameterization: ``r1 = softplus(theta_r1)``, ``r2 = softplus(theta_r2)``
    for the log variant and ``r2 = 2 sigmoid(theta_r2)`` for the power. The authors instead clamp
    their parameters in place into ``[0.01, inf)`` (and ``r2`` into ``[0.01, 2]``) at each forward
    pass; a clamp inside the formula would give a parameter past its bound no gradient ever again,
    while softplus and sigmoid keep every value reachable and differentiable.

    Start as the authors' code: log, ``r1 ~ U(0, 2)``, ``r2 ~ U(0, 1)``; power, ``r1 ~ U(0, 1)``,
    ``r2 ~ U(0, 2)`` (from the global generator, as ``nn.Linear``'s weights; kept inside
    ``[0.01, 1.99]``, where the parameterization is well conditioned).
    """

    def __init__(self, num_heads: int, variant: str = "log"):
        super().__init__()
        check_int("num_heads", num_heads, low=1)
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        self.num_heads, self.variant = num_heads, variant
        r1_high, r2_high = (2.0, 1.0) if variant == "log" else (1.0, 2.0)
        r1 = (torch.rand(num_heads, dtype=torch.float64) * r1_high).clamp(0.01, 1.99)
        r2 = (torch.rand(num_heads, dtype=torch.float64) * r2_high).clamp(0.01, 1.99)
        theta_r2 = inverse_softplus(r2) if variant == "log" else torch.logit(r2 / 2)
        dtype = torch.get_default_dtype()
        self.theta_r1 = nn.Parameter(inverse_softplus(r1).to(dtype))
        self.theta_r2 = nn.Parameter(theta_r2.to(dtype))
        self.by_lag = PositionTable(self, self.of_lag)

    @property
    def r1(self) -> Tensor:
        """``(H,)``, positive."""
        return F.softplus(self.theta_r1)

    @property
    def r2(self) -> Tensor:
        """``(H,)``, positive; at most 2 for the power variant."""
        return F.softplus(self.theta_r2) if self.variant == "log" else 2 * torch.sigmoid(self.theta_r2)

    def of_lag(self, lag: Tensor) -> Tensor:
        """``K`` at lags ``d = i - j`` ``(n,)``, ``(H, n)``."""
        distance = lag.abs()  # (n,), integers: the products below widen them
        r1, r2 = self.r1[:, None], self.r2[:, None]  # (H, 1)
        if self.variant == "log":
            return -(r1 * torch.log1p(r2 * distance))  # the logarithmic variant
        return -(r1 * distance**r2)  # the power variant

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, variant={self.variant!r}"


register("kerple", KERPLE, variant="'log' (-r1 log(1 + r2 |i - j|)) or 'power' (-r1 |i - j|^r2, r2 <= 2)")
