"""FIRE (Li et al., 2024): functional interpolation for relative positions."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checks import check_int
from .base import Prior, ScaledLag, in_own_dtype
from .math import inverse_softplus, pairwise_lags
from .registry import register

__all__ = ["FIRE"]


class FIRE(Prior):
    """``K_h(i, j) = f_theta(psi(i - j) / psi(max(L, i)))_h`` with ``psi(x) = log(c x + 1)``.

    Li et al. (ICLR 2024), "Functional Interpolation for Relative Positions Improves Long Context
    Transformers", Sec. 3 (the log transform ``psi`` and progressive interpolation): ``f_theta``
    an MLP from one input to ``H`` outputs (one hidden ReLU layer of ``hidden`` units), ``c`` and the
    threshold ``L`` learnable scalars. Dividing by ``psi(i)`` maps every query's lags into ``[0, 1]``
    whatever its position; the threshold keeps short contexts from being stretched.

    Here ``c = softplus(theta_c)`` and ``L = softplus(theta_L)`` stay positive (the paper does not
    say how it keeps them so), starting at ``c = 1`` and ``L = threshold``; the MLP's output layer
    starts at zero, so a new FIRE is standard attention. The paper's attention is causal (``i >= j``);
    for a key after its query ``psi`` is continued as an odd function, ``sign(x) log(c |x| + 1)``,
    so the prior is finite at every pair of integer positions, negative ones included.

    It depends on the query's position ``i``, not only on ``i - j``: no lag table and no fold. The
    ``reference`` route evaluates it densely, ``memeff`` on each block of queries and keys (the MLP
    at ``rows x Lk`` points of a block, O(L) memory), a decode step on its tile, and ``triton``
    (causal, positions >= 0) interpolates the MLP on a grid of ``x`` in the kernel
    (:meth:`scaled_lag`, within :meth:`grid_error_bound`); ``sdpa`` and ``flex`` refuse it.
    """

    def __init__(self, num_heads: int, hidden: int = 32, threshold: float = 512.0):
        super().__init__()
        check_int("num_heads", num_heads, low=1)
        check_int("hidden", hidden, low=1)
        if isinstance(threshold, bool) or not (
            isinstance(threshold, int | float) and 0 < threshold < math.inf
        ):
            raise ValueError(f"threshold must be a finite number > 0, got {threshold!r}")
        self.num_heads = num_heads
        dtype = torch.get_default_dtype()
        self.theta_c = nn.Parameter(inverse_softplus(torch.tensor(1.0, dtype=torch.float64)).to(dtype))
        self.theta_L = nn.Parameter(
            inverse_softplus(torch.tensor(float(threshold), dtype=torch.float64)).to(dtype)
        )
        self.mlp = nn.Sequential(nn.Linear(1, hidden), nn.ReLU(), nn.Linear(hidden, num_heads))
        nn.init.zeros_(self.mlp[2].weight)
        nn.init.zeros_(self.mlp[2].bias)

    def psi(self, x: Tensor, c: Tensor | None = None) -> Tensor:
        """``log(c x + 1)``, continued as an odd function below 0, for real or integer ``x`` (the
        product with ``c``, :attr:`c` unless given, widens integers)."""
        c = self.c if c is None else c
        return torch.copysign(torch.log1p(c * x.abs()), x)

    @property
    def c(self) -> Tensor:
        """``c = softplus(theta_c)``, positive."""
        return F.softplus(self.theta_c)

    def normaliser(self, q_pos: Tensor, c: Tensor | None = None) -> Tensor:
        """``psi(max(L, i))`` at query positions ``i``: progressive interpolation, the scale that maps
        each query's lags into ``[0, 1]``. Its argument is positive (``L > 0``), where ``psi`` is
        ``log(c x + 1)``; ``torch.maximum`` widens integer positions itself."""
        c = self.c if c is None else c
        return torch.log1p(c * torch.maximum(F.softplus(self.theta_L), q_pos))

    def log_prior(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        dtype = self.theta_c.dtype
        lag = pairwise_lags(q_pos, k_pos).to(dtype)  # (..., Lq, Lk), exact integers
        with in_own_dtype(lag.device):
            c = self.c
            K = self.mlp(
                (self.psi(lag, c) / self.normaliser(q_pos, c)[..., :, None])[..., None]
            )  # (..., Lq, Lk, H)
        return K.movedim(-1, -3)  # (..., H, Lq, Lk)

    @property
    def is_scaled_lag(self) -> bool:
        return True

    def scaled_lag(self, lags: Tensor, q_pos: Tensor, cells: int) -> ScaledLag:
        """``x = psi(i - j) / psi(max(L, i))``, in ``[0, 1]`` for causal attention on positions >= 0,
        and the MLP on a grid of it: ``a = psi(lags)``, ``r = 1 / psi(max(L, q_pos))``, ``g_h(m /
        cells)``. The MLP is piecewise linear in ``x`` (one ReLU layer), so interpolating its grid
        is exact on every cell without a kink, and off by at most :meth:`grid_error_bound` inside one."""
        dtype = self.theta_c.dtype
        with in_own_dtype(lags.device):
            c = self.c
            lag_scale = self.psi(lags, c)
            row_scale = torch.reciprocal(self.normaliser(q_pos, c))
            points = torch.linspace(0.0, 1.0, cells + 1, dtype=dtype, device=lags.device)
            grid = self.mlp(points[:, None]).T  # (H, cells + 1)
        return ScaledLag(lag_scale, row_scale, grid)

    def grid_error_bound(self, cells: int) -> Tensor:
        """``(H,)``: how far linear interpolation on ``cells`` uniform cells of ``[0, 1]`` can be from
        the MLP. Hidden unit k bends ``g_h`` by ``|W2[h, k] W1[k]|`` at its kink ``x = -b1[k] / W1[k]``,
        and linear interpolation across a kink of bend ``b`` in a cell of width ``1 / cells`` is off
        by at most ``b / (4 cells)``; summed over the kinks inside ``[0, 1]``, as if they shared one
        cell."""
        w1, b1 = self.mlp[0].weight[:, 0].detach(), self.mlp[0].bias.detach()
        kink = -b1 / torch.where(w1 == 0, torch.ones_like(w1), w1)
        inside = (w1 != 0) & (kink >= 0) & (kink <= 1)
        bends = (self.mlp[2].weight.detach() * w1).abs() * inside  # (H, hidden)
        return bends.sum(-1) / (4 * cells)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, hidden={self.mlp[0].out_features}"


register(
    "fire",
    FIRE,
    hidden="the MLP f_theta's hidden width (the paper's 32)",
    threshold="where the learnable threshold L starts: queries before it are normalised by psi(L)",
)
