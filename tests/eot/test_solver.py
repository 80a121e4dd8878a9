"""The numerical solver: convergence certificate, non-convex regularizers, bad input."""

from __future__ import annotations

import pytest
import torch

from priorattn.eot import NotConverged, Shannon, Tsallis, check_convex, solve


def test_solution_beats_every_other_point_of_the_simplex():
    gen = torch.Generator().manual_seed(3)
    scores = torch.randn(3, 7, generator=gen, dtype=torch.float64)
    omega = Tsallis(1.5)
    solution = solve(scores, omega)

    def objective(p):
        return -(p * scores).sum(-1) + omega.penalty(p)

    others = torch.rand(200, 3, 7, generator=gen, dtype=torch.float64) ** 4
    others = others / others.sum(-1, keepdim=True)
    torch.testing.assert_close(solution.p.sum(-1), torch.ones(3, dtype=torch.float64))
    assert (solution.p >= 0).all() and (solution.gap <= 1e-12).all()
    assert (objective(solution.p) <= objective(others) + 1e-12).all()


@pytest.mark.parametrize(
    "omega",
    [
        lambda p: torch.special.entr(p).sum(-1),  # +H(p): concave
        lambda p: -(p * p).sum(-1),
        lambda p: torch.sin(8 * p).sum(-1),
    ],
    ids=["entropy", "negative_l2", "sine"],
)
def test_non_convex_regularizer_is_a_clear_error(omega):
    scores = torch.randn(2, 6, dtype=torch.float64)
    with pytest.raises(ValueError, match="the regularizer is not convex on the simplex"):
        solve(scores, omega)


def test_library_regularizers_pass_the_convexity_check():
    visible = torch.ones(4, 9, dtype=torch.bool)
    for omega in (Shannon(0.1), Tsallis(1.01), Tsallis(2.0), Tsallis(7.0)):
        check_convex(omega, visible)


def test_too_few_iterations_is_not_converged():
    with pytest.raises(NotConverged, match="did not reach tol=1e-12 in max_iter=2 iterations"):
        solve(torch.randn(2, 6, dtype=torch.float64), Tsallis(1.25), max_iter=2)


def test_one_step_solves_the_entropy_at_its_temperature():
    """Mirror descent with the entropy map and step 1 / tau lands on softmax(s / tau) at once: the
    backtracking finds that step within a few iterations."""
    scores = torch.randn(4, 12, dtype=torch.float64)
    assert solve(scores, Shannon(0.5)).iterations <= 5


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(visible=torch.tensor([[True, False], [False, False]])),
            "every row needs at least one visible key",
        ),
        (dict(scores=torch.tensor([[0.0, float("nan")]])), "scores of visible keys must be finite"),
        (dict(omega="sparsemax"), "omega must be a Regularizer or a callable"),
    ],
)
def test_bad_input_is_a_clear_error(kwargs, message):
    args = dict(scores=torch.zeros(2, 2, dtype=torch.float64), omega=Shannon(), visible=None) | kwargs
    with pytest.raises((ValueError, TypeError), match=message):
        solve(args["scores"], args["omega"], args["visible"])
