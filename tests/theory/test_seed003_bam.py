"""Seed 003 (BAM) as property tests in float64, each named after the statement it checks.

Thm. 1 and ``Z = exp(I(cont; pos))`` (App. I), Lemmas 3-4 and Theorems 2-4 (Sec. 2.2-2.4, App. B),
and SSMax's sharpness (Sec. 2.5), against the library's ``GGD`` and ``ALiBi`` priors and SSMax in
its attention op. The seed writes ``b_ij = -|(j - i - mu) / alpha|^beta``; the library's ``GGD`` is
``-exp(theta_alpha) (|j - i - mu| + eps)^theta_beta``, so ``exp(theta_alpha) = alpha^-beta`` and,
at ``eps = 0``, the seed's formula exactly. Verdicts: docs/theory.md.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from maps import alibi, attention_weights, causal_visible, weight_on

import priorattn
from priorattn.eot import content_position_log_z, content_range
from priorattn.functional.normalizers import masked_softmax
from priorattn.priors import GGD, Uniform

F64 = torch.float64
#: Row lengths for the limits |j - i| -> infinity: one query at the end of a row of n keys.
LENGTHS = (64, 512, 4096)


def ggd(theta_alpha: float, beta: float, eps: float = 1e-5, theta_mu: float = 0.0) -> GGD:
    """One GGD head with exactly these float64 parameters."""
    prior = GGD(1, trainable=("alpha", "beta", "mu"), eps=eps).double()
    with torch.no_grad():
        prior.theta_alpha.fill_(theta_alpha)
        prior.theta_beta.fill_(beta)
        prior.theta_mu.fill_(theta_mu)
    return prior


#: GGD shapes of either sign, and the positive ones of Lemma 4.
ANY_BETA, POSITIVE_BETA = st.floats(-1.5, 2.0), st.floats(0.05, 2.0)


@st.composite
def ggd_problems(draw, betas=ANY_BETA):
    """Random queries and keys of one head under a random GGD prior, causal or not."""
    L = draw(st.integers(1, 24))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    content = draw(st.sampled_from([0.1, 1.0, 4.0]))
    q = content * torch.randn(1, 1, L, 4, generator=gen, dtype=F64)
    k = torch.randn(1, 1, L, 4, generator=gen, dtype=F64)
    prior = ggd(draw(st.floats(-2.0, 1.0)), draw(betas), theta_mu=draw(st.floats(-1.0, 1.0)))
    return q, k, prior, draw(st.booleans())


def split(q, k, prior, causal):
    """Content scores ``f``, log-prior ``g`` (both ``(L, L)``) and the visible keys."""
    L = q.shape[2]
    f = (q @ k.transpose(-1, -2))[0, 0] / math.sqrt(q.shape[-1])
    pos = torch.arange(L)
    g = prior.log_prior(pos, pos)[0]
    visible = causal_visible(L) if causal else torch.ones(L, L, dtype=torch.bool)
    return f, g, visible


def lag_matrix(L: int) -> torch.Tensor:
    pos = torch.arange(L)
    return (pos[:, None] - pos[None, :]).abs().to(F64)


# --- Thm. 1 and App. I: Z --------------------------------------------------------------------


@given(ggd_problems())
def test_thm_1_weights_factorize_into_content_and_position_times_z(problem):
    """p_ij = Z p(f_j) p(g_j), with log Z = log Z_cont + log Z_pos - log Z_joint (App. I.1)."""
    q, k, prior, causal = problem
    p = attention_weights(q, k, prior=prior, causal=causal)[0, 0]
    f, g, visible = split(q, k, prior, causal)
    log_z = content_position_log_z(f, g, visible)
    product = log_z.exp()[:, None] * masked_softmax(f, visible) * masked_softmax(g, visible)
    torch.testing.assert_close(p, product, rtol=1e-10, atol=1e-14)


@given(ggd_problems())
def test_app_i3_paper_information_equals_log_z_and_is_never_negative(problem):
    """sum_j p_j log(p_j / (p(f_j) p(g_j))) = log Z (App. I.3), and log Z = -log <p(f), p(g)> >= 0."""
    q, k, prior, causal = problem
    f, g, visible = split(q, k, prior, causal)
    p = masked_softmax(f + g, visible)
    product = masked_softmax(f, visible) * masked_softmax(g, visible)
    support = p > 0
    ratio = torch.where(support, p / torch.where(support, product, 1.0), 1.0)
    information = torch.where(support, p * ratio.log(), 0.0).sum(-1)
    log_z = content_position_log_z(f, g, visible)
    torch.testing.assert_close(information, log_z, rtol=1e-9, atol=1e-9)
    assert (log_z >= -1e-12).all()


@given(st.integers(1, 64), st.integers(0, 2**16))
def test_app_i3_z_is_not_a_mutual_information_counterexample(n, seed):
    """App. I.3: "Z = 1 iff content and position are independent (I = 0)". A uniform prior carries
    no positional information at all, yet log Z = log n for every content: log Z measures how little
    the two distributions overlap, not dependence."""
    content = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=F64)
    log_z = content_position_log_z(content, torch.zeros(n, dtype=F64))
    torch.testing.assert_close(log_z, torch.tensor(math.log(n), dtype=F64))
    # Z = 1 only when both are the same single key: e.g. two sharp distributions on key 0
    sharp = torch.full((n,), -50.0, dtype=F64)
    sharp[0] = 0.0
    assert content_position_log_z(sharp, sharp).item() < 1e-15 * n + 1e-18


@given(st.integers(2, 32), st.integers(0, 2**16))
def test_app_i1_z_is_the_reciprocal_of_the_overlap_counterexample(n, seed):
    """App. I.1 writes Z_cont Z_pos / Z_joint = sum_j softmax(f)_j softmax(g)_j (and App. I.2 sets Z
    to that sum). The two are reciprocals: their product is 1, so they agree only when both are 1."""
    gen = torch.Generator().manual_seed(seed)
    f, g = torch.randn(2, n, generator=gen, dtype=F64)
    z = content_position_log_z(f, g).exp()
    overlap = (torch.softmax(f, -1) * torch.softmax(g, -1)).sum()
    torch.testing.assert_close(z * overlap, torch.tensor(1.0, dtype=F64))
    assert z > 1 > overlap


# --- Lemma 3 (App. B.3): ALiBi is local attention ---------------------------------------------


@given(st.integers(2, 48), st.floats(0.01, 2.0), st.sampled_from([0.1, 1.0, 4.0]), st.integers(0, 2**16))
def test_lemma_3_alibi_weight_falls_exponentially_with_distance_for_bounded_content(L, slope, content, seed):
    """p_ij <= exp(omega_i - m |i - j|): seed 000 Thm. 5.1 with pi_ij <= exp(-m |i - j|). It goes to 0
    as |i - j| grows as long as the content range omega_i stays bounded."""
    gen = torch.Generator().manual_seed(seed)
    q = content * torch.randn(1, 1, L, 4, generator=gen, dtype=F64)
    k = torch.randn(1, 1, L, 4, generator=gen, dtype=F64)
    prior = alibi(slope)
    p = attention_weights(q, k, prior=prior)[0, 0]
    f, _, visible = split(q, k, prior, True)
    omega = content_range(f, visible)[:, None]
    assert (p <= torch.exp(omega - slope * lag_matrix(L)) * (1 + 1e-12)).all()


def test_lemma_3_needs_bounded_content_counterexample():
    """Lemma 3's proof sends the bias to -inf and ignores the content. A content score that grows
    faster than m |i - j| (here s_ij = -c j, c > m: keys whose content favours the start) keeps the
    weight on the most distant key above 1 - exp(-(c - m)) at every length."""
    slope, c = 0.5, 1.0
    for n in LENGTHS:
        q = torch.ones(1, 1, 1, 1, dtype=F64)
        k = -c * torch.arange(n, dtype=F64).view(1, 1, n, 1)
        far = weight_on(q, k, torch.arange(n) == 0, prior=alibi(slope), scale=1.0)
        assert far.item() >= 1 - math.exp(-(c - slope))


# --- Lemma 4 (App. B.4): GGD with beta > 0 is local attention ---------------------------------


@given(ggd_problems(betas=POSITIVE_BETA))
def test_lemma_4_ggd_weight_is_bounded_by_its_prior_share(problem):
    """p_ij <= exp(omega_i + b_ij - max_k b_ik), for any beta (seed 000 Thm. 5.1)."""
    q, k, prior, causal = problem
    p = attention_weights(q, k, prior=prior, causal=causal)[0, 0]
    f, g, visible = split(q, k, prior, causal)
    top = g.masked_fill(~visible, -math.inf).amax(-1, keepdim=True)
    omega = content_range(f, visible)[:, None]
    assert (p <= torch.exp(omega + g - top) * (1 + 1e-12) + 1e-300).all()


@given(st.floats(-2.0, 1.0), st.floats(0.05, 2.0), st.floats(-1.0, 1.0))
def test_lemma_4_ggd_log_prior_goes_to_minus_infinity_with_distance(theta_alpha, beta, theta_mu):
    """For beta > 0, b(d) <= -exp(theta_alpha) (d - |mu|)^beta: with the bound above, p -> 0."""
    prior = ggd(theta_alpha, beta, theta_mu=theta_mu)
    mu = 2 * math.sinh(theta_mu)
    lags = torch.tensor([10.0**e for e in range(1, 13)], dtype=F64)
    b = torch.stack([prior.log_prior(torch.tensor([int(d)]), torch.tensor([0]))[0, 0, 0] for d in lags])
    assert (b.diff() < 0).all()
    assert (b <= -math.exp(theta_alpha) * (lags - abs(mu)) ** beta * (1 - 1e-12)).all()


# --- Theorem 2 (App. B.5): GGD with beta < 1 sees more context than ALiBi ----------------------


@given(st.floats(0.01, 2.0), st.floats(0.05, 0.95), st.integers(2, 10**6))
def test_thm_2_ggd_to_alibi_bias_ratio_is_below_one_from_lag_two(slope, beta, lag):
    """alpha = m^(-1 / beta) (theta_alpha = log m), mu = 0: B_ij / A_ij = |j - i|^(beta - 1) < 1
    for |j - i| >= 2, exactly at eps = 0 and with the library's eps."""
    q_pos, k_pos = torch.tensor([lag]), torch.tensor([0])
    alibi_bias = alibi(slope).log_prior(q_pos, k_pos).item()
    exact = ggd(math.log(slope), beta, eps=0.0).log_prior(q_pos, k_pos).item() / alibi_bias
    assert exact < 1 and abs(exact - lag ** (beta - 1)) <= 1e-12
    assert ggd(math.log(slope), beta).log_prior(q_pos, k_pos).item() / alibi_bias < 1


def test_thm_2_ratio_is_not_below_one_at_lag_one_counterexample():
    """At |j - i| = 1 the ratio is 1^(beta - 1) = 1, not < 1 (and at 0 it is 0 / 0); the library's
    eps makes it (1 + eps)^beta > 1. The claim holds from lag 2 on."""
    slope, beta = 0.25, 0.5
    one = (torch.tensor([1]), torch.tensor([0]))
    alibi_bias = alibi(slope).log_prior(*one).item()
    assert ggd(math.log(slope), beta, eps=0.0).log_prior(*one).item() / alibi_bias == 1.0
    assert ggd(math.log(slope), beta).log_prior(*one).item() / alibi_bias > 1.0


@given(
    st.integers(2, 40),
    st.floats(0.01, 2.0),
    st.floats(0.05, 0.95),
    st.sampled_from([0.1, 1.0, 4.0]),
    st.integers(0, 2**16),
)
def test_thm_2_ggd_keeps_more_weight_beyond_every_distance_than_alibi(L, slope, beta, content, seed):
    """What "sees more context" means for the weights: for the same content, the GGD of Theorem 2
    puts at least as much weight as ALiBi on the keys beyond every lag D (its weights are ALiBi's
    times exp(b - a), which grows with the lag)."""
    gen = torch.Generator().manual_seed(seed)
    q = content * torch.randn(1, 1, L, 4, generator=gen, dtype=F64)
    k = torch.randn(1, 1, L, 4, generator=gen, dtype=F64)
    far_ggd = attention_weights(q, k, prior=ggd(math.log(slope), beta))[0, 0].cumsum(-1)
    far_alibi = attention_weights(q, k, prior=alibi(slope))[0, 0].cumsum(-1)
    assert (far_ggd >= far_alibi - 1e-12).all()  # [i, j]: the weight on keys 0..j, lags >= i - j


# --- Theorem 3 (App. B.6): beta < 0 ignores local context ---------------------------------------


@given(st.integers(2, 24), st.floats(-2.0, 1.0), st.floats(-1.5, -0.05), st.integers(0, 2**16))
def test_thm_3_negative_beta_gives_the_own_key_zero_weight(L, theta_alpha, beta, seed):
    """At eps = 0 (the seed's formula) b_ii = -inf for beta < 0: every query that sees another key
    gives its own key exactly zero weight."""
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 1, 1, L, 4, generator=gen, dtype=F64)
    p = attention_weights(q, k, prior=ggd(theta_alpha, beta, eps=0.0))[0, 0]
    assert (p.diagonal()[1:] == 0).all()


@given(st.integers(2, 24), st.floats(-2.0, 1.0), st.floats(-1.5, -0.05), st.integers(0, 2**16))
def test_thm_3_neighbours_are_not_ignored(L, theta_alpha, beta, seed):
    """Theorem 3's "local context" is only the own key: at lag >= 1 the bias -exp(theta_alpha)
    (d + eps)^beta lies in [-exp(theta_alpha), 0), so the neighbour at lag 1 keeps
    p >= exp(-omega - exp(theta_alpha)) / n."""
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 1, 1, L, 4, generator=gen, dtype=F64)
    prior = ggd(theta_alpha, beta)
    p = attention_weights(q, k, prior=prior)[0, 0]
    f, _, visible = split(q, k, prior, True)
    omega = content_range(f, visible)
    n = torch.arange(1, L + 1, dtype=F64)
    floor = torch.exp(-omega - math.exp(theta_alpha)) / n
    assert (p.diagonal(-1) >= floor[1:] * (1 - 1e-12)).all()


def test_thm_3_first_query_has_no_other_key_counterexample():
    """The first query of a causal row sees only its own key; at eps = 0 its only logit is -inf and
    its weights are 0 / 0: Theorem 3 needs a query that sees at least one other key."""
    b = ggd(0.0, -0.5, eps=0.0).log_prior(torch.tensor([0]), torch.tensor([0]))[0, 0]
    assert b.item() == -math.inf and torch.softmax(b, -1).isnan().all()


@pytest.mark.parametrize("backend", ["reference", "memeff"])
def test_first_query_with_minus_infinite_log_prior_gives_no_weight_to_masked_keys(backend):
    """Found by these checks: a row whose visible logits are all -inf gave its weight to the masked
    (future) keys, filled with finfo.min > -inf. Such a row now gets zeros, and finite gradients."""
    L = 6
    prior = GGD(1, trainable=("alpha", "beta", "mu"))  # float32, default eps
    with torch.no_grad():
        prior.theta_beta.fill_(-8.0)  # (1e-5)^-8 = 1e40 overflows float32: b_00 = -inf
    k = torch.randn(1, 1, L, 4, requires_grad=True)
    p = attention_weights(torch.zeros(1, 1, L, 4), k, prior=prior, backend=backend)[0, 0]
    assert (p[0] == 0).all() and torch.allclose(p[1:].sum(-1), torch.ones(L - 1))
    assert (p.triu(1) == 0).all()
    p.sum().backward()
    assert torch.isfinite(k.grad).all()


def test_a_decode_step_whose_visible_key_has_minus_infinite_log_prior_gives_no_weight_to_hidden_keys():
    """The same row as a decode step (one query against a longer cache: ``auto``'s bias-tile route)."""
    prior = GGD(1, trainable=("alpha", "beta", "mu"))
    with torch.no_grad():
        prior.theta_beta.fill_(-8.0)
    L = 6
    eye = torch.eye(L).expand(1, 1, L, L)
    p = priorattn.attention(torch.zeros(1, 1, 1, 4), torch.randn(1, 1, L, 4), eye, prior=prior,
                            q_pos=torch.tensor([0]))  # fmt: skip
    assert (p == 0).all()


def test_thm_3_library_eps_leaves_weight_on_the_own_key_counterexample():
    """The library's eps = 1e-5 makes b_ii = -exp(theta_alpha) eps^beta finite: at theta_alpha = 0,
    beta = -0.1 that is -3.16, so with no content signal the own key keeps
    exp(-(eps^beta - (1 + eps)^beta)) = 0.115 of its neighbour's weight, not 0."""
    eps, beta = 1e-5, -0.1
    p = attention_weights(
        torch.zeros(1, 1, 2, 4, dtype=F64), torch.randn(1, 1, 2, 4, dtype=F64), prior=ggd(0.0, beta)
    )
    ratio = (p[0, 0, 1, 1] / p[0, 0, 1, 0]).item()
    assert abs(ratio - math.exp(-(eps**beta - (1 + eps) ** beta))) < 1e-12 and ratio > 0.1


# --- Theorem 4 (App. B.7): beta < 0 attends to arbitrarily long context ------------------------


def far_key_row(n: int, content: float, gen: torch.Generator):
    """One query at position n - 1 over n keys with bounded content: q, k and its content range."""
    q = content * torch.randn(1, 1, 1, 4, generator=gen, dtype=F64)
    k = torch.randn(1, 1, n, 4, generator=gen, dtype=F64)
    omega = content_range((q @ k.transpose(-1, -2))[0, 0, 0] / 2).item()  # scale 1 / sqrt(4)
    return q, k, omega


@settings(max_examples=25)
@given(st.floats(-2.0, 1.0), st.floats(-1.5, -0.05), st.sampled_from([0.1, 1.0]), st.integers(0, 2**16))
def test_thm_4_distant_weight_still_vanishes_for_bounded_content_counterexample(
    theta_alpha, beta, content, seed
):
    """Theorem 4 claims lim p_ij != 0 as |j - i| -> inf for beta < 0. With bounded content it is
    false: every bias at lag >= 1 lies in [-c, 0), c = exp(theta_alpha), so the far key competes with
    n - 1 keys of comparable weight and p_i0 <= exp(omega + c) / (n - 1) -> 0."""
    gen = torch.Generator().manual_seed(seed)
    c = math.exp(theta_alpha)
    for n in LENGTHS:
        q, k, omega = far_key_row(n, content, gen)
        far = weight_on(q, k, torch.arange(n) == 0, prior=ggd(theta_alpha, beta)).item()
        assert far <= math.exp(omega + c) / (n - 1) * (1 + 1e-12)
    assert far < 0.02


@settings(max_examples=25)
@given(st.floats(-2.0, 1.0), st.floats(-1.5, -0.05), st.sampled_from([0.1, 1.0]), st.integers(0, 2**16))
def test_thm_4_far_half_of_the_context_keeps_a_fixed_share_unlike_alibi(theta_alpha, beta, content, seed):
    """What holds instead: the keys F at lags >= n / 2 together keep at least (|F| / n) exp(-omega - c)
    of the weight at every length (no single distant key does), as they do with no prior at all
    (NoPE, at least (|F| / n) exp(-omega)), while under ALiBi their share is below
    exp(omega - m n / 2) -> 0."""
    gen = torch.Generator().manual_seed(seed)
    c, slope = math.exp(theta_alpha), 0.1
    for n in LENGTHS:
        q, k, omega = far_key_row(n, content, gen)
        far_half = torch.arange(n) <= (n - 1) // 2  # keys at lags >= (n - 1) - (n - 1) // 2
        fraction = far_half.sum().item() / n
        share = weight_on(q, k, far_half, prior=ggd(theta_alpha, beta)).item()
        assert share >= fraction * math.exp(-omega - c) * (1 - 1e-12)
        assert weight_on(q, k, far_half, prior=Uniform()).item() >= fraction * math.exp(-omega) * (1 - 1e-12)
        alibi_share = weight_on(q, k, far_half, prior=alibi(slope)).item()
        assert alibi_share <= math.exp(omega - slope * (n - 1 - (n - 1) // 2)) * (1 + 1e-12)


@settings(max_examples=25)
@given(st.floats(-2.0, 0.0), st.floats(-1.5, -0.3))
def test_thm_4_holds_with_ssmax_and_a_content_margin(theta_alpha, beta):
    """With SSMax (logits times s log n, prior included) and a far key whose content beats every other
    key by Delta with s Delta > 1, the far key's weight is at least 1 / (1 + (n - 1) n^(-s (Delta + b)))
    with b = b(n - 1) -> 0, so it goes to 1 (slowly when |beta| is small: b(n) ~ -exp(theta_alpha) n^beta;
    the parameters here reach 0.9 by n = 4096). Without SSMax it goes to 0, and so it does under ALiBi
    with SSMax: there the bias -m (n - 1) outgrows any margin."""
    s, margin = 1.0, 2.0
    ssmax = torch.tensor([s], dtype=F64)
    weights = []
    for n in LENGTHS:
        q = torch.ones(1, 1, 1, 1, dtype=F64)
        k = torch.zeros(1, 1, n, 1, dtype=F64)
        k[0, 0, 0] = margin  # content score Delta on the farthest key, 0 elsewhere (scale 1)
        key = torch.arange(n) == 0
        prior = ggd(theta_alpha, beta)
        far = weight_on(q, k, key, prior=prior, scale=1.0, ssmax=ssmax).item()
        b = prior.log_prior(torch.tensor([n - 1]), torch.tensor([0])).item()
        assert far >= 1 / (1 + (n - 1) * n ** (-s * (margin + b))) * (1 - 1e-12)
        plain = weight_on(q, k, key, prior=prior, scale=1.0).item()
        assert plain <= math.exp(margin + math.exp(theta_alpha)) / (n - 1) * (1 + 1e-12)
        assert weight_on(q, k, key, prior=alibi(0.1), scale=1.0, ssmax=ssmax).item() < 1e-6
        weights.append(far)
    assert weights[-1] > 0.9 and weights == sorted(weights)


# --- SSMax (Sec. 2.5): sharpness regardless of the length -----------------------------------------


@settings(max_examples=25)
@given(st.floats(0.1, 3.0), st.floats(0.1, 3.0))
def test_ssmax_keeps_a_peak_iff_scale_times_margin_exceeds_one(s, margin):
    """One key Delta above n - 1 equal ones: under SSMax its weight is exactly 1 / (1 + (n - 1) n^(-s Delta)),
    which goes to 1 if s Delta > 1 and to 0 if s Delta < 1: "preserves sharpness regardless of input
    size" holds given s Delta > 1."""
    weights = []
    for n in LENGTHS:
        q = torch.ones(1, 1, 1, 1, dtype=F64)
        k = torch.zeros(1, 1, n, 1, dtype=F64)
        k[0, 0, 0] = margin
        p = weight_on(
            q, k, torch.arange(n) == 0, prior=Uniform(), scale=1.0, ssmax=torch.tensor([s], dtype=F64)
        )
        expected = 1 / (1 + (n - 1) * n ** (-s * margin))
        assert abs(p.item() - expected) <= 1e-12
        weights.append(expected)
    if s * margin > 1.05:
        assert weights == sorted(weights)
    if s * margin < 0.95:
        assert weights == sorted(weights, reverse=True)
