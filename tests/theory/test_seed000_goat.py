"""Seed 000 (GOAT) as property tests in float64, each named after the statement it checks.

Thm. 5.1 and 5.4 (Sec. 5, App. D), Prop. F.5, Thm. 3, Prop. F.6 and Thm. 4 (App. F), against the
library's priors and attention op. Verdicts: docs/theory.md.
"""

from __future__ import annotations

import math

import torch
from factories import GATED, PRIOR_NAMES, make_prior
from hypothesis import given, settings
from hypothesis import strategies as st
from maps import alibi, attention_weights, causal_visible

import priorattn
from priorattn.eot import (
    content_range,
    context_sensitivity,
    maxent_recency,
    maxent_recency_rate,
    mean_lag,
    recency_prior,
    sensitivity_bound,
    sink_margin,
    solve,
)
from priorattn.functional.normalizers import masked_softmax, neg_entropy
from priorattn.priors import GOAT, Uniform

F64 = torch.float64


@st.composite
def attention_problems(draw):
    """One head-pair of random queries and keys under a random library prior, causal or not, with
    content from negligible to dominant."""
    L = draw(st.integers(1, 24))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    content = draw(st.sampled_from([1e-6, 0.1, 1.0, 4.0]))
    q = content * torch.randn(1, 2, L, 4, generator=gen, dtype=F64)
    k = torch.randn(1, 2, L, 4, generator=gen, dtype=F64)
    names = [n for n in PRIOR_NAMES if n not in GATED]  # the theorems take a prior of positions
    prior = make_prior(draw(st.sampled_from(names)), 2, seed=draw(st.integers(0, 99)))
    causal = draw(st.booleans()) or not prior.can_fold(False)  # ALiBi and GOAT's slope are causal
    return q, k, prior, causal


def content_and_prior(q, k, prior, causal):
    """Content scores ``(1, 2, L, L)`` as the op scales them, the prior ``pi`` and the visible keys."""
    L = q.shape[2]
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    visible = causal_visible(L) if causal else torch.ones(L, L, dtype=torch.bool)
    pos = torch.arange(L)
    pi = masked_softmax(prior.log_prior(pos, pos).to(F64).expand_as(scores), visible)
    return scores, pi, visible


# --- Thm. 5.1 (Eq. 25): pi exp(-omega) <= p <= pi exp(omega) ----------------------------------


@given(attention_problems())
def test_thm_5_1_posterior_is_within_a_factor_exp_omega_of_the_prior(problem):
    q, k, prior, causal = problem
    p = attention_weights(q, k, prior=prior, causal=causal)
    scores, pi, visible = content_and_prior(q, k, prior, causal)
    omega = content_range(scores, visible)[..., None]
    slack = 1e-12
    assert (p <= pi * torch.exp(omega) * (1 + slack) + 1e-300).all()
    assert (p >= pi * torch.exp(-omega) * (1 - slack) - 1e-300).all()


@given(attention_problems(), st.sampled_from([1e-2, 1e-4, 1e-8]))
def test_thm_5_1_posterior_collapses_to_the_prior_as_omega_goes_to_zero(problem, shrink):
    q, k, prior, causal = problem
    p = attention_weights(shrink * q, k, prior=prior, causal=causal)
    scores, pi, visible = content_and_prior(shrink * q, k, prior, causal)
    omega = content_range(scores, visible)[..., None]
    # |p - pi| <= pi (exp(omega) - 1): the bound of Eq. 25, which goes to zero with omega
    assert ((p - pi).abs() <= pi * torch.expm1(omega) * (1 + 1e-9) + 1e-15).all()


# --- Thm. 5.4 (Eq. 30-31) and Def. 5.3 (Eq. 28-29) ----------------------------------------------


def test_thm_5_4_uniform_prior_sensitivity_is_one_minus_one_over_n():
    """Eq. 30 / 54: with no content signal, Psi = (n - 1) / n for a row of n keys, -> 1 (causal row i
    has n = i + 1 keys, so one sequence covers n = 1..L)."""
    L = 64
    q, k = torch.zeros(1, 1, L, 4, dtype=F64), torch.randn(1, 1, L, 4, dtype=F64)
    p = attention_weights(q, k, prior=Uniform())
    n = torch.arange(1, L + 1, dtype=F64)
    torch.testing.assert_close(context_sensitivity(p, 0)[0, 0], (n - 1) / n, rtol=1e-14, atol=1e-15)
    torch.testing.assert_close(sensitivity_bound(torch.zeros(L, dtype=F64), n), (n - 1) / n)


@given(attention_problems())
def test_thm_5_4_prior_margin_bounds_the_context_sensitivity(problem):
    """Eq. 31 for every row, with the sink at the prior's favourite visible key (margin >= 0), and
    the same bound at any content range omega: Psi <= (n - 1) / (exp(delta - omega) + n - 1)."""
    q, k, prior, causal = problem
    p = attention_weights(q, k, prior=prior, causal=causal)
    scores, pi, visible = content_and_prior(q, k, prior, causal)
    log_pi = pi.log()  # the normalized log-prior: the same margins as the unnormalized one
    sink = log_pi.masked_fill(~visible, -math.inf).argmax(-1)
    delta = sink_margin(log_pi, sink, visible)
    bound = sensitivity_bound(delta, visible.sum(-1), content_range(scores, visible))
    assert (context_sensitivity(p, sink) <= bound + 1e-12).all()


@given(st.integers(2, 500), st.floats(0.0, 30.0))
def test_thm_5_4_bound_is_attained_by_a_key_only_sink(n, delta):
    """With no content signal and every other key exactly delta below the sink, Eq. 31 is equality;
    and a margin delta = log(n - 1) + c keeps Psi at 1 / (1 + e^c) for every n (the seed's "delta ~ ln L")."""
    log_prior = torch.zeros(n, dtype=F64)
    log_prior[0] = delta
    p = torch.softmax(log_prior, -1)
    torch.testing.assert_close(
        context_sensitivity(p, 0), sensitivity_bound(torch.tensor(delta, dtype=F64), n)
    )
    c = 2.0
    log_prior[0] = math.log(n - 1) + c
    torch.testing.assert_close(
        context_sensitivity(torch.softmax(log_prior, -1), 0), torch.tensor(1 / (1 + math.exp(c)), dtype=F64)
    )


@given(attention_problems(), st.floats(1e-3, 10.0))
def test_def_5_3_output_moves_at_most_eps_psi_when_context_values_move(problem, eps):
    """Eq. 29: ||Delta o_i|| <= eps Psi when every value but the sink's moves by at most eps."""
    q, k, prior, causal = problem
    L = q.shape[2]
    sink = 0  # key 0 is visible to every query, causal or not
    gen = torch.Generator().manual_seed(L)
    v = torch.randn(1, 2, L, 3, generator=gen, dtype=F64)
    step = torch.randn(1, 2, L, 3, generator=gen, dtype=F64)
    step = eps * step / step.norm(dim=-1, keepdim=True)
    step[:, :, sink] = 0
    moved = priorattn.attention(q, k, v + step, prior=prior, causal=causal)
    still = priorattn.attention(q, k, v, prior=prior, causal=causal)
    psi = context_sensitivity(attention_weights(q, k, prior=prior, causal=causal), sink)
    assert ((moved - still).norm(dim=-1) <= eps * psi * (1 + 1e-9) + 1e-12).all()


# --- Prop. F.5 (Eq. 86-87): the rotated query realizes a full Fourier mode -----------------------


def one_mode_goat(omega: float, alpha: float, beta: float) -> GOAT:
    prior = GOAT(1, 1, sink=False, slope=False, learnable_freqs=True).double()
    with torch.no_grad():
        prior.freqs.fill_(omega)
        prior.alpha.fill_(alpha)
        prior.beta.fill_(beta)
    return prior


positions = st.integers(-(10**5), 10**5)


@given(st.floats(-4.0, 4.0), st.floats(-3.0, 3.0), st.floats(-3.0, 3.0), positions, positions)
def test_prop_f5_goat_fold_is_an_exact_bilinear_fourier_mode(omega, alpha, beta, i, j):
    prior = one_mode_goat(omega, alpha, beta)
    q_pos, k_pos = torch.tensor([i]), torch.tensor([j])
    lanes = prior.fold(q_pos, k_pos)
    expected = alpha * math.cos(omega * (i - j)) + beta * math.sin(omega * (i - j))  # Eq. 87
    eq_86_q = [
        alpha * math.cos(omega * i) + beta * math.sin(omega * i),
        alpha * math.sin(omega * i) - beta * math.cos(omega * i),
    ]
    eq_86_k = [math.cos(omega * j), math.sin(omega * j)]
    tol = 1e-9 * (1 + abs(alpha) + abs(beta))
    torch.testing.assert_close(lanes.q[0, 0], torch.tensor(eq_86_q, dtype=F64), rtol=0, atol=tol)
    torch.testing.assert_close(lanes.k[0, 0], torch.tensor(eq_86_k, dtype=F64), rtol=0, atol=tol)
    assert abs((lanes.q[0, 0] @ lanes.k[0, 0]).item() - expected) <= tol
    assert abs(prior.log_prior(q_pos, k_pos).item() - expected) <= tol


@given(st.integers(0, 2**16), st.integers(1, 4))
def test_prop_f5_antisymmetric_part_of_goat_is_its_sine_terms(seed, R):
    """K(i, j) - K(j, i) = 2 sum_r beta_r sin(w_r (i - j)): the beta terms carry the direction."""
    gen = torch.Generator().manual_seed(seed)
    prior = GOAT(2, R, sink=False, slope=False).double()
    with torch.no_grad():
        prior.alpha.copy_(torch.randn(2, R, generator=gen, dtype=F64))
        prior.beta.copy_(torch.randn(2, R, generator=gen, dtype=F64))
    pos = torch.arange(-7, 9)
    K = prior.log_prior(pos, pos)
    lag = (pos[:, None] - pos[None, :]).to(F64)
    sines = torch.sin(lag[..., None] * prior.freqs)  # (L, L, R)
    torch.testing.assert_close(K - K.transpose(-1, -2), 2 * (sines * prior.beta[:, None, None, :]).sum(-1))


@given(st.floats(0.1, math.pi - 0.1), st.floats(0.0, 2 * math.pi))
def test_prop_f5_a_fourier_mode_needs_two_lanes(omega, angle):
    """alpha cos + beta sin of w (i - j), (alpha, beta) != 0 and w not a multiple of pi, is a rank-2
    matrix over positions: no single lane (rank 1) realizes it, so the fold's 2 lanes are minimal."""
    prior = one_mode_goat(omega, math.cos(angle), math.sin(angle))
    pos = torch.arange(12)
    assert torch.linalg.matrix_rank(prior.log_prior(pos, pos)[0]).item() == 2


#: ALiBi slopes of either sign; the SDPA route fails on subnormal slopes (docs/theory.md), so none.
slopes = st.one_of(st.just(0.0), st.floats(1e-6, 2.0), st.floats(-2.0, -1e-6))


# --- Thm. 3 (Eq. 92-93): the maximum-entropy recency prior is exponential in the lag -------------


def entropy(q):
    return -neg_entropy(q)


@settings(max_examples=5)
@given(st.integers(2, 8), st.floats(0.05, 0.95))
def test_thm_3_exponential_prior_is_the_numerical_entropy_maximizer(L, fraction):
    """max H(q) s.t. sum_d d q_d = mu, solved by the library's convex solver without assuming the
    form: an augmented Lagrangian for the mean constraint, each inner problem by ``solve``."""
    mu = fraction * (L - 1)
    lag = torch.arange(L, dtype=F64) / (L - 1)  # lags scaled to [0, 1] keep the penalty well conditioned
    target, multiplier, rho = fraction, 0.0, 50.0
    for _ in range(60):

        def omega(p, y=multiplier):
            gap = (p * lag).sum(-1) - target
            return neg_entropy(p) + y * gap + rho / 2 * gap**2

        p = solve(torch.zeros(L, dtype=F64), omega, tol=1e-14).p
        gap = ((p * lag).sum() - target).item()
        multiplier += rho * gap
        if abs(gap) < 1e-13:
            break
    torch.testing.assert_close(p, maxent_recency(mu, L), rtol=0, atol=1e-9)


@st.composite
def feasible_lag_priors(draw):
    """A length L, a mean mu in (0, L - 1) and a random prior over lags 0..L-1 with mean exactly mu:
    a random point of the simplex mixed with the point mass at lag 0 or L - 1 that moves its mean to mu."""
    L = draw(st.integers(2, 30))
    mu = draw(st.floats(0.02, 0.98)) * (L - 1)
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    power = draw(st.sampled_from([1.0, 3.0]))
    r = (-torch.rand(L, generator=gen, dtype=F64).log()) ** power
    r = r / r.sum()
    m = mean_lag(r).item()
    end = 0 if m > mu else L - 1
    t = (end - mu) / (end - m)
    q = t * r
    q[end] += 1 - t
    return L, mu, q


@given(feasible_lag_priors())
def test_thm_3_every_other_prior_with_that_mean_has_less_entropy(problem):
    """H(q*) - H(q) = KL(q || q*) > 0 for every other q with the same mean lag: the maximizer is unique."""
    L, mu, q = problem
    best = maxent_recency(mu, L)
    assert abs(mean_lag(q).item() - mu) < 1e-9 and abs(mean_lag(best).item() - mu) < 1e-9
    kl = (torch.special.xlogy(q, q) - torch.special.xlogy(q, best)).sum()
    torch.testing.assert_close(entropy(best) - entropy(q), kl, rtol=1e-9, atol=1e-12)
    assert kl > 0 or torch.allclose(q, best, atol=1e-6)


@given(slopes, st.integers(1, 40))
def test_thm_3_causal_alibi_row_is_the_maxent_recency_prior(slope, i):
    """ALiBi with slope lambda gives query i, over its i + 1 causal keys, exactly the Eq. 93 prior
    over lags; that prior's mean gives back lambda."""
    pos = torch.arange(i + 1)
    log_prior = alibi(slope).log_prior(pos, pos)[0, i]
    by_lag = torch.softmax(log_prior, -1).flip(-1)  # key j has lag i - j
    torch.testing.assert_close(by_lag, recency_prior(slope, i + 1))
    if i >= 1 and abs(slope) < 1.5:
        assert abs(maxent_recency_rate(mean_lag(by_lag).item(), i + 1) - slope) < 1e-8


# --- Prop. F.6 (Eq. 103-104): ALiBi is a key-linear bias under a causal mask --------------------


@given(st.integers(1, 30), slopes, st.integers(0, 2**16))
def test_prop_f6_causal_alibi_equals_a_key_linear_bias(L, slope, seed):
    gen = torch.Generator().manual_seed(seed)
    prior = alibi(slope)
    pos = torch.arange(L)
    visible = causal_visible(L)
    lanes = prior.fold(pos, pos)  # the library's fold: no lanes, a key-linear slope
    assert lanes.width == 1 and lanes.q.shape[-1] == 0 and lanes.slope.item() == slope
    scores = torch.randn(L, L, generator=gen, dtype=F64)
    lag_bias = prior.log_prior(pos, pos)[0]  # -m (i - j) on the visible keys
    key_bias = slope * pos.to(F64).expand(L, L)  # m j
    torch.testing.assert_close(
        masked_softmax(scores + lag_bias, visible), masked_softmax(scores + key_bias, visible)
    )
    q, k = (
        torch.randn(1, 1, L, 4, generator=gen, dtype=F64),
        torch.randn(1, 1, L, 4, generator=gen, dtype=F64),
    )
    folded = attention_weights(q, k, prior=prior, backend="sdpa")  # the key-linear lane
    dense = attention_weights(q, k, prior=prior, backend="reference")  # -m |i - j|
    torch.testing.assert_close(folded, dense)


def test_prop_f6_without_a_causal_mask_alibi_is_not_key_linear_counterexample():
    """ALiBi is -m |i - j|; only the causal mask makes it -m (i - j). A query with keys on both sides
    sees a V-shaped bias, which no key-linear term plus row constant matches."""
    L, slope = 9, 0.5
    pos = torch.arange(L)
    prior = alibi(slope)
    everyone = torch.ones(L, L, dtype=torch.bool)
    lag_bias = prior.log_prior(pos, pos)[0]
    key_bias = slope * pos.to(F64).expand(L, L)
    gap = masked_softmax(lag_bias, everyone) - masked_softmax(key_bias, everyone)
    assert gap[4].abs().max() > 0.1  # the middle query
    assert not prior.can_fold(causal=False)


# --- Thm. 4 (Eq. 107): key-only priors are rank one and need one lane ---------------------------


@settings(max_examples=25)
@given(st.integers(0, 2**16), st.integers(2, 20))
def test_thm_4_key_only_prior_is_rank_one_with_one_lane(seed, L):
    gen = torch.Generator().manual_seed(seed)
    prior = GOAT(3, 0, sink=True, slope=False, train_len=16).double()  # the sink u_h(j) alone
    with torch.no_grad():
        for p in prior.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=F64))
    pos = torch.arange(L)
    U = prior.log_prior(pos, pos)  # (H, L, L)
    u = prior.sink(pos)  # (H, L)
    torch.testing.assert_close(U, u[:, None, :].expand_as(U))  # U = 1 u^T: identical rows
    assert all(torch.linalg.matrix_rank(U[h]).item() == 1 for h in range(3))
    lanes = prior.fold(pos, pos)
    assert prior.fold_width == 1 and lanes.q.shape[-1] == 0 and lanes.slope is None
    torch.testing.assert_close(lanes.key_bias, u)
    # Zero lanes leave only per-query constants, which softmax ignores: a non-constant u changes
    # the weights (here with no content, softmax(u) against uniform), so one lane is also necessary.
    p = attention_weights(
        torch.zeros(1, 3, L, 4, dtype=F64), torch.randn(1, 3, L, 4, dtype=F64), prior=prior, causal=False
    )
    torch.testing.assert_close(p[0, :, 0], torch.softmax(u, -1))
    assert (torch.softmax(u, -1) - 1 / L).abs().max() > 1e-6
