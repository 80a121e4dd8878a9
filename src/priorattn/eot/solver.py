"""A numerical solver of ``argmin_{p in simplex} -<p, s> + Omega(p)`` for any convex ``Omega``.

Mirror descent with the entropy mirror map (exponentiated gradient) in float64: the iterates stay in
the simplex, masked keys stay at exactly zero, and the step size per row is found by backtracking
until the step is smooth relative to the entropy,
``<g' - g, p' - p> <= <log p' - log p, p' - p> / eta``. For ``Omega = tau * negentropy`` the step
``eta = 1 / tau`` lands on the solution at once; for the sparse maps the weights off the support
decay geometrically. The stopping rule is the Frank-Wolfe duality gap ``<g, p> - min_j g_j``, an
upper bound on ``J(p) - J(p*)`` for convex ``J`` (seed 004 Sec. 4.1: a convex ``Omega`` makes every
local minimum global). ``Omega`` is first checked for midpoint convexity on random points of the
simplex, so a non-convex regularizer is an error, not a wrong answer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from ..functional.normalizers import Regularizer

Penalty = Callable[[Tensor], Tensor]

#: Random pairs of points on which midpoint convexity is checked.
CONVEXITY_PAIRS = 64
#: Halvings of the step size tried per iteration before the solver gives up on a row's step.
MAX_HALVINGS = 60


class NotConverged(RuntimeError):
    """The duality gap did not fall below the tolerance within ``max_iter`` iterations."""


class Solution(NamedTuple):
    """What :func:`solve` returns: the attention weights, a bound on their objective's distance to the
    optimum, and the iterations it took."""

    p: Tensor  # (..., Lk) float64, on the simplex of the visible keys
    gap: Tensor  # (...,) Frank-Wolfe duality gap: J(p) - J(p*) <= gap
    iterations: int


def _penalty(omega: Regularizer | Penalty, visible: Tensor) -> Penalty:
    if isinstance(omega, Regularizer):
        return lambda p: omega.penalty(p, visible)
    if not callable(omega):
        raise TypeError(
            f"omega must be a Regularizer or a callable p -> Omega(p), got {type(omega).__name__}"
        )
    return omega


def random_simplex_points(visible: Tensor, n: int, generator: torch.Generator) -> Tensor:
    """``(n, ..., Lk)`` float64 points of the simplex of the visible keys: normalized Exp(1) draws
    (uniform on the simplex) raised to powers 1 to 4, so some lie near its faces."""
    shape = (n, *visible.shape)
    e = -torch.rand(shape, generator=generator, dtype=torch.float64).log()
    power = torch.arange(n, dtype=torch.float64).remainder(4).add(1).view(n, *[1] * visible.dim())
    e = torch.where(visible, e.pow(power), 0.0)
    return e / e.sum(-1, keepdim=True)


def check_convex(omega: Regularizer | Penalty, visible: Tensor, seed: int = 0) -> None:
    """Raise ``ValueError`` if ``Omega((p + q) / 2) > (Omega(p) + Omega(q)) / 2`` beyond rounding for
    random pairs of points on the simplex of ``visible`` (``(..., Lk)`` bool)."""
    penalty = _penalty(omega, visible)
    gen = torch.Generator().manual_seed(seed)
    p, q = random_simplex_points(visible, 2 * CONVEXITY_PAIRS, gen).chunk(2)
    mid, chord = penalty((p + q) / 2), (penalty(p) + penalty(q)) / 2
    slack = 1e-9 * (1 + chord.abs())
    excess = mid - chord - slack
    if (excess > 0).any():
        worst = excess.flatten().argmax()
        raise ValueError(
            f"the regularizer is not convex on the simplex: Omega((p + q) / 2) = "
            f"{mid.flatten()[worst].item():.6g} > (Omega(p) + Omega(q)) / 2 = "
            f"{chord.flatten()[worst].item():.6g} at a random pair of points (midpoint check); "
            "argmin -<p, s> + Omega(p) is then not well defined by a local method"
        )


def _relatively_smooth(p: Tensor, new: Tensor, grad: Tensor, new_grad: Tensor, eta: Tensor) -> Tensor:
    """``(..., 1)``: whether ``<g' - g, p' - p> <= <log p' - log p, p' - p> / eta``, the step's
    smoothness relative to the entropy. Written with gradients rather than objective values, it
    stays decidable near the solution, where ``J`` changes by less than its rounding."""
    dp = new - p
    both = torch.isfinite(grad) & torch.isfinite(new_grad)
    curvature = torch.where(both, (new_grad - grad) * dp, 0.0).sum(-1, keepdim=True)
    positive = (p > 0) & (new > 0)
    divergence = torch.where(positive, (new.log() - p.log()) * dp, 0.0).sum(-1, keepdim=True)
    return curvature <= divergence / eta * (1 + 1e-9)


def solve(
    scores: Tensor,
    omega: Regularizer | Penalty,
    visible: Tensor | None = None,
    *,
    tol: float = 1e-12,
    max_iter: int = 20000,
) -> Solution:
    """``argmin_{p in simplex} -<p, scores> + Omega(p)`` over the last dim of ``scores: (..., Lk)``.

    ``omega``: a :class:`Regularizer` or a callable ``p (..., Lk) -> Omega(p) (...)`` that is convex
    on the simplex and differentiable by autograd in its interior (leading dims broadcast). Keys
    where ``visible`` is False get exactly zero weight; every row needs a visible key. Stops when
    every row's duality gap is at most ``tol``; raises :class:`NotConverged` after ``max_iter``.
    """
    scores = scores.detach().to(torch.float64)
    visible = torch.ones_like(scores, dtype=torch.bool) if visible is None else visible.expand_as(scores)
    if not visible.any(-1).all():
        raise ValueError("every row needs at least one visible key (the simplex of no keys is empty)")
    if not torch.isfinite(scores[visible]).all():
        raise ValueError("scores of visible keys must be finite")
    check_convex(omega, visible)
    penalty = _penalty(omega, visible)

    def objective(p: Tensor) -> Tensor:
        return -(p * torch.where(visible, scores, 0.0)).sum(-1) + penalty(p)

    def value_and_grad(p: Tensor) -> Tensor:
        p = p.detach().requires_grad_(True)
        (grad,) = torch.autograd.grad(objective(p).sum(), p)
        return torch.where(visible, grad, 0.0)

    p = visible.to(torch.float64) / visible.sum(-1, keepdim=True)
    eta = torch.ones(scores.shape[:-1] + (1,), dtype=torch.float64)
    grad = value_and_grad(p)
    for iteration in range(max_iter + 1):
        # The Frank-Wolfe gap over keys where the gradient is finite (a weight that underflowed to
        # zero under an entropy has gradient -inf; it carries nothing).
        finite = visible & torch.isfinite(grad)
        low = grad.masked_fill(~finite, torch.inf).amin(-1, keepdim=True)
        gap = (torch.where(finite & (p > 0), grad, 0.0) * p).sum(-1) - low[..., 0]
        active = (gap > tol)[..., None]
        if not active.any():
            return Solution(p, gap, iteration)
        if iteration == max_iter:
            break
        shifted = torch.where(finite, grad - low, torch.inf)  # >= 0: exp(-eta * shifted) cannot overflow
        eta = torch.where(active, eta * 2, eta)
        for _ in range(MAX_HALVINGS):
            candidate = p * torch.exp(-eta * shifted)
            candidate = torch.where(active, candidate / candidate.sum(-1, keepdim=True), p)
            new_grad = value_and_grad(candidate)
            ok = _relatively_smooth(p, candidate, grad, new_grad, eta)
            if ok.all():
                break
            eta = torch.where(ok, eta, eta / 2)
        p, grad = candidate, new_grad
    raise NotConverged(
        f"solve did not reach tol={tol:g} in max_iter={max_iter} iterations (largest duality gap "
        f"{gap.max().item():.3g}); raise max_iter or tol"
    )
