"""Each closed-form map of the variational family against the numerical solver, and its penalty
against its formula written out here (seed 004 Sec. 3-4, seed 000 Prop. 3.1)."""

from __future__ import annotations

import math

import pytest
import torch
from factories import GATED, make_prior
from hypothesis import given
from hypothesis import strategies as st

import priorattn
from priorattn.eot import KLToPrior, Locality, Shannon, Tsallis, regularizer, solve
from priorattn.priors import ALiBi

ROWS, KEYS = 6, 10


def rows(seed: int):
    """Scores, a mask with a visible key in every row, a log-prior and distances, float64."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(ROWS, KEYS, generator=gen, dtype=torch.float64) * 2
    visible = torch.rand(ROWS, KEYS, generator=gen) > 0.3
    visible[:, 3] = True
    log_prior = torch.randn(ROWS, KEYS, generator=gen, dtype=torch.float64)
    distance = (torch.arange(KEYS)[None] - torch.randint(0, KEYS, (ROWS, 1), generator=gen)).abs()
    return scores, visible, log_prior, distance.double()


def xlogx(p):
    return torch.where(p > 0, p * p.clamp_min(1e-300).log(), 0.0)


def kl_to(log_prior, visible, tau):
    """tau KL(p || pi), pi the prior normalized over the visible keys."""
    weights = torch.where(visible, log_prior.exp(), 0.0)
    pi = weights / weights.sum(-1, keepdim=True)
    return lambda p: (
        tau * torch.where(p > 0, p * (p.clamp_min(1e-300) / pi.clamp_min(1e-300)).log(), 0.0).sum(-1)
    )


def cases(seed: int = 0):
    """(closed form, the same Omega written out independently) pairs."""
    _, visible, log_prior, distance = rows(seed)
    return {
        "shannon": (Shannon(0.7), lambda p: 0.7 * xlogx(p).sum(-1)),
        "kl_prior": (KLToPrior(log_prior, 1.3), kl_to(log_prior, visible, 1.3)),
        "sparsemax_l2": (regularizer("sparsemax"), lambda p: 0.5 * (p * p).sum(-1)),
        "sparsemax_tau": (Tsallis(2, tau=0.4), lambda p: 0.2 * (p * p).sum(-1)),
        "entmax15": (Tsallis(1.5, tau=0.5), lambda p: 0.5 / 0.75 * (p**1.5 - p).sum(-1)),
        "entmax3": (Tsallis(3.0), lambda p: (p**3 - p).sum(-1) / 6),
        "entmax1.25": (Tsallis(1.25, tau=2.0), lambda p: 2.0 / (1.25 * 0.25) * (p**1.25 - p).sum(-1)),
        "locality": (
            Locality(0.3, distance, 0.8),
            lambda p: 0.8 * xlogx(p).sum(-1) + 0.3 * (p * distance).sum(-1),
        ),
    }


@pytest.mark.parametrize("name", list(cases()))
def test_closed_form_is_the_solution_of_the_variational_problem(name):
    scores, visible, _, _ = rows(0)
    omega, written_out = cases()[name]
    solution = solve(scores, written_out, visible, tol=1e-13)
    p = omega.normalize(scores, visible)
    assert solution.gap.max() <= 1e-13
    torch.testing.assert_close(p, solution.p, atol=1e-9, rtol=0)
    assert (p[~visible] == 0).all()


@pytest.mark.parametrize("name", list(cases()))
def test_penalty_is_its_formula(name):
    _, visible, _, _ = rows(0)
    omega, written_out = cases()[name]
    p = torch.rand(5, ROWS, KEYS, dtype=torch.float64) ** 3 * visible
    p = p / p.sum(-1, keepdim=True)
    if isinstance(omega, Tsallis) and omega.alpha == 2.0:  # 1/2 ||p||^2 - 1/2 on the simplex
        torch.testing.assert_close(omega.penalty(p, visible), written_out(p) - omega.tau / 2)
    else:
        torch.testing.assert_close(omega.penalty(p, visible), written_out(p))


def test_kl_is_zero_exactly_at_the_prior():
    _, visible, log_prior, _ = rows(1)
    pi = torch.where(visible, log_prior.exp(), 0.0)
    pi = pi / pi.sum(-1, keepdim=True)
    torch.testing.assert_close(
        KLToPrior(log_prior, 2.0).penalty(pi, visible), torch.zeros(ROWS, dtype=torch.float64)
    )


def test_library_prior_as_kl_regularizer_is_prior_attention(prior_name):
    """seed 000 Prop. 3.1 / Eq. 11: softmax(s / tau + log pi) with s = <q, k> and tau = sqrt(D) is
    the attention op with the prior."""
    if prior_name in GATED:
        pytest.skip("a gated prior depends on q; the map here is of a prior of positions alone")
    B, H, L, D = 2, 4, 9, 8
    q, k, v = (torch.randn(B, H, L, D, dtype=torch.float64) for _ in range(3))
    prior = make_prior(prior_name, H)
    pos = torch.arange(L)
    omega = KLToPrior.of(prior, pos, pos, tau=math.sqrt(D))
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    p = omega.normalize(q @ k.transpose(-1, -2), causal)
    expected = priorattn.attention(q, k, v, prior=prior, backend="reference")
    torch.testing.assert_close(p @ v, expected)


def test_locality_penalty_is_alibi():
    """seed 004 Prop. 4.4: Shannon plus gamma |i - j| is softmax with ALiBi's bias, slope gamma / tau."""
    B, H, L, D = 1, 4, 7, 16
    q, k, v = (torch.randn(B, H, L, D, dtype=torch.float64) for _ in range(3))
    tau = math.sqrt(D)
    prior = ALiBi(H).double()
    pos = torch.arange(L)
    omega = Locality.of_positions(tau * prior.slopes[:, None, None], pos, pos, tau)
    p = omega.normalize(q @ k.transpose(-1, -2))
    torch.testing.assert_close(
        p @ v, priorattn.attention(q, k, v, prior=prior, causal=False, backend="reference")
    )


MAPS = {
    "softmax": Shannon,
    "sparsemax": lambda tau: Tsallis(2.0, tau),
    "entmax15": lambda tau: Tsallis(1.5, tau),
    "entmax1.25": lambda tau: Tsallis(1.25, tau),
    "entmax3": lambda tau: Tsallis(3.0, tau),
}


@given(
    spec=st.sampled_from(sorted(MAPS)),
    keys=st.integers(1, 9),
    seed=st.integers(0, 2**16),
    tau=st.sampled_from([0.3, 1.0, 4.0]),
)
def test_masked_keys_get_zero_weight_and_empty_rows_zero(spec, keys, seed, tau):
    gen = torch.Generator().manual_seed(seed)
    scores = (torch.randn(4, keys, generator=gen, dtype=torch.float64) * 5).requires_grad_(True)
    visible = torch.rand(4, keys, generator=gen) > 0.5
    visible[0] = False  # a row that sees nothing
    visible[1, 0] = True
    p = MAPS[spec](tau).normalize(scores, visible)
    assert (p[~visible] == 0).all() and (p[0] == 0).all()
    seen = visible.any(-1)
    torch.testing.assert_close(p[seen].sum(-1), torch.ones(int(seen.sum()), dtype=torch.float64))
    assert (p >= 0).all()
    (p * torch.randn(p.shape, generator=gen, dtype=torch.float64)).sum().backward()
    assert torch.isfinite(scores.grad).all() and (scores.grad[~visible] == 0).all()


def test_sparse_maps_reach_exact_zeros_among_visible_keys():
    scores = torch.tensor([[3.0, 2.8, 0.0, -1.0]], dtype=torch.float64)
    for spec in ("sparsemax", "entmax15", 3.0):
        p = regularizer(spec).normalize(scores)
        assert p[0, 0] > p[0, 1] > 0 and (p[0, 2:] == 0).all(), spec
    assert (Shannon().normalize(scores) > 0).all()


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: Tsallis(1.0), "alpha must be a finite number > 1"),
        (lambda: Tsallis(0.5), "alpha must be a finite number > 1"),
        (lambda: regularizer(1), "alpha must be a finite number > 1"),
        (lambda: regularizer("sparsemaxx"), "unknown normalizer 'sparsemaxx'"),
        (lambda: regularizer(True), "normalizer must be one of"),
        (lambda: Shannon(0.0), "tau must be a finite number > 0"),
        (lambda: Locality(-1.0, torch.zeros(3)), "gamma must be finite and >= 0"),
        (lambda: KLToPrior([0.0, 1.0]), "log_prior must be a floating-point tensor"),
    ],
)
def test_bad_regularizers_are_clear_errors(make, message):
    with pytest.raises(ValueError, match=message):
        make()
