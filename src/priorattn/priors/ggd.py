"""BAM's Generalized-Gaussian positional prior (seed 003 Section 2.3, parameterization of App. C)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..checks import check_int
from .base import LagPrior, PositionTable
from .math import alibi_slopes
from .registry import FromModel, register

__all__ = ["GGD"]

PARAMETERS = ("alpha", "beta", "mu")


class GGD(LagPrior):
    """``b_ij = -exp(theta_alpha) * (|(j - i) - (exp(theta_mu) - exp(-theta_mu))| + eps) ** theta_beta``.

    Seed 003 App. C: scale ``alpha = exp(-theta_alpha / theta_beta)``, shape ``beta = theta_beta``,
    location ``mu = 2 sinh(theta_mu)``. ``eps`` keeps negative shapes finite at ``j - i = mu``;
    a negative ``theta_beta`` inverts the prior towards distant keys (seed 003 Theorems 3-4).

    ``init="uniform"`` sets every parameter to 0, a constant prior (standard attention);
    ``init="alibi"`` sets ``theta_beta = 1``, ``theta_mu = 0`` and ``theta_alpha = log(slope_h)``,
    which is ALiBi up to ``eps``. Only the parameters named in ``trainable`` receive gradients.
    """

    def __init__(
        self,
        num_heads: int,
        init: str = "uniform",
        trainable: tuple[str, ...] = ("alpha", "beta"),
        eps: float = 1e-5,
    ):
        super().__init__()
        check_int("num_heads", num_heads, low=1)
        if isinstance(eps, bool) or not (isinstance(eps, int | float) and 0 <= eps < math.inf):
            raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
        unknown = set(trainable) - set(PARAMETERS)
        if unknown:
            raise ValueError(
                f"trainable names unknown parameters {sorted(unknown)}; choose from {PARAMETERS}"
            )
        if init == "uniform":
            alpha, beta = torch.zeros(num_heads), torch.zeros(num_heads)
        elif init == "alibi":
            alpha, beta = alibi_slopes(num_heads).log(), torch.ones(num_heads)
        else:
            raise ValueError(f"init must be 'uniform' or 'alibi', got {init!r}")
        dtype = torch.get_default_dtype()
        self.num_heads = num_heads
        self.eps = eps
        self.theta_alpha = nn.Parameter(alpha.to(dtype), requires_grad="alpha" in trainable)
        self.theta_beta = nn.Parameter(beta.to(dtype), requires_grad="beta" in trainable)
        self.theta_mu = nn.Parameter(torch.zeros(num_heads, dtype=dtype), requires_grad="mu" in trainable)
        self.by_lag = PositionTable(self, self.of_lag)

    def of_lag(self, lag: Tensor) -> Tensor:
        """``b`` at lags ``d = i - j`` ``(n,)``, ``(H, n)``."""
        # |(j - i) - mu| = |d + 2 sinh(theta_mu)|; the sum widens the integer lags itself
        gap = torch.add(lag, torch.sinh(self.theta_mu)[:, None], alpha=2).abs() + self.eps
        return -(self.theta_alpha.exp()[:, None] * gap ** self.theta_beta[:, None])

    def extra_repr(self) -> str:
        trainable = [n for n in PARAMETERS if getattr(self, f"theta_{n}").requires_grad]
        return f"num_heads={self.num_heads}, eps={self.eps:g}, trainable={tuple(trainable)}"


register(
    "ggd",
    GGD,
    init=FromModel("'uniform' (every parameter 0: standard attention) or 'alibi' (ALiBi up to eps)", "init"),
    trainable="which of alpha, beta, mu learn (seed 003 trains alpha and beta, App. F.2)",
    eps="added to |j - i - mu|, so a negative shape stays finite at j - i = mu",
)
