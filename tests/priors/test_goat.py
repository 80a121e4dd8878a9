"""GOAT's prior against seed 000 Section 4 written out here: its terms, starts, slope cap, autocast
and learnable frequencies (its options: test_goat_options.py; against goat-attention:
test_goat_attention.py)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from factories import grid, make_prior

import priorattn
from priorattn.priors import GOAT, ALiBi, PerHeadSink
from priorattn.priors.math import inverse_softplus

#: GOAT's cases, by name: the options of each (the sink, the slope and the gate of each kind).
VARIANTS = {
    "goat": dict(),  # the shared sink and a learned slope
    "goat_noslope": dict(slope="none", sink="per_head"),
    "goat_fixed": dict(slope="fixed", sink="none"),
    "goat_gate": dict(gate=True),
}


def random_goat(options: dict):
    """``make(heads, rand)`` of a small GOAT (3 frequencies, a sink of 2 frequencies and 4 hidden
    units) with ``options`` and every parameter drawn within 1/2."""
    return lambda heads, rand: rand.fill(
        GOAT(heads, 3, **options, train_len=64, sink_freqs=2, sink_hidden=4), scale=0.5
    )


#: The shared tests' GOATs (tests/factories.py).
RANDOM_PRIORS = {case: random_goat(options) for case, options in VARIANTS.items()}


def goat_by_hand(prior, i, j, h):
    total = 0.0
    for r, w in enumerate(prior.freqs.tolist()):
        total += prior.alpha[h, r].item() * math.cos(w * (i - j))
        total += prior.beta[h, r].item() * math.sin(w * (i - j))
    sink = prior.sink
    if sink is not None:
        freqs = sink.freqs.tolist()
        feats = [math.cos(w * j) for w in freqs] + [math.sin(w * j) for w in freqs]
        feats += [j / sink.train_len, math.copysign(math.log1p(abs(j)), j) / math.log1p(sink.train_len)]
        x = torch.tensor(feats, dtype=torch.float64)
        hidden = torch.nn.functional.silu(sink.mlp[0].weight @ x + sink.mlp[0].bias)
        out = sink.mlp[2].weight @ hidden + sink.mlp[2].bias
        if isinstance(sink, PerHeadSink):  # per head, with a linear decay
            total += out[h].item() - sink.decay[h].item() * j / sink.train_len
        else:  # shared, times a per-head gain, plus a per-head bump at j = 0
            total += sink.gain[h].item() * out[0].item() + sink.bump[h].item() * (j == 0)
    if prior.slope_raw is not None:  # m = softplus(raw)
        total -= math.log1p(math.exp(prior.slope_raw[h].item())) * abs(i - j)
    elif prior.slopes is not None:  # fixed
        total -= prior.slopes[h].item() * abs(i - j)
    return total


def log_prior_by_hand(prior, h, i, j):
    return goat_by_hand(prior, i, j, h)


def test_goat_matches_section_4_formula():
    prior = make_prior("goat", 2, seed=3)
    q_pos, k_pos = grid(4, 7, offset=3)
    K = prior.log_prior(q_pos, k_pos)
    for h in range(2):
        for i, qi in enumerate(q_pos.tolist()):
            for j, kj in enumerate(k_pos.tolist()):
                assert K[h, i, j].item() == pytest.approx(goat_by_hand(prior, qi, kj, h), abs=1e-12)


def test_goat_sink_is_defined_at_negative_positions():
    """The sink's log input continues as an odd function, so ``u`` is finite before position 0."""
    prior = make_prior("goat", 2, seed=4)
    q_pos, k_pos = torch.arange(-5, 0), torch.arange(-9, 0)
    K = prior.log_prior(q_pos, k_pos)
    assert torch.isfinite(K).all()
    for i, qi in enumerate(q_pos.tolist()):
        for j, kj in enumerate(k_pos.tolist()):
            assert K[1, i, j].item() == pytest.approx(goat_by_hand(prior, qi, kj, 1), abs=1e-12)


def test_goat_terms_stay_in_the_parameters_dtype_under_autocast():
    """The sink MLP and the spectral sums are not rounded to bfloat16 by autocast (issue 13)."""
    prior = make_prior("goat", 3, dtype=torch.float32)
    pos = torch.arange(40)[None]
    plain = prior.fold(pos, pos), prior.log_prior(pos[0], pos[0])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = prior.fold(pos, pos), prior.log_prior(pos[0], pos[0])
    assert autocast[0].key_bias.dtype == torch.float32 and autocast[1].dtype == torch.float32
    assert torch.equal(autocast[0].key_bias, plain[0].key_bias) and torch.equal(autocast[1], plain[1])
    meta = GOAT(2, 2).to("meta")  # a device autocast does not know: nothing to turn off
    assert meta.log_prior(pos[0].to("meta"), pos[0].to("meta")).shape == (2, 40, 40)


def test_goat_without_frequencies_is_its_sink_and_slope():
    prior = GOAT(2, 0, sink_freqs=2, sink_hidden=4).double()
    with torch.no_grad():
        for p in prior.parameters():
            p.uniform_(-0.5, 0.5)
    q_pos, k_pos = grid(4, 6, offset=2)
    lag = (q_pos[:, None] - k_pos[None, :]).abs().double()
    expected = prior.sink(k_pos)[:, None, :] - prior.fold_slope()[:, None, None] * lag
    torch.testing.assert_close(prior.log_prior(q_pos, k_pos), expected, rtol=0, atol=1e-12)
    assert prior.fold_width == 2


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_heads=4, num_freqs=0, sink=False, slope=False), "has no term left: it is standard"),
        (dict(num_heads=4, num_freqs=-1), "num_freqs must be an int >= 0, got -1"),
        (dict(num_heads=0), "num_heads must be a positive int, got 0"),
        (dict(num_heads=2, max_slope=0.0), "max_slope must be a positive finite number, got 0.0"),
        (dict(num_heads=2, max_slope=float("inf")), "max_slope must be a positive finite number, got inf"),
    ],
)
def test_goat_construction_names_the_problem(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GOAT(**kwargs)


def test_goat_slope_is_capped_at_max_slope():
    """``m_h = softplus(slope_raw)`` is capped at ``max_slope``, in every term and fold."""
    capped, exact = GOAT(2, 2, max_slope=0.25).double(), GOAT(2, 2).double()
    with torch.no_grad():
        capped.slope_raw.copy_(torch.tensor([0.5, -2.0]))  # m = 0.97 (capped: 0.25), 0.127
        exact.slope_raw.copy_(torch.tensor([0.0, -2.0], dtype=torch.float64))
        exact.slope_raw[0] = inverse_softplus(torch.tensor(0.25, dtype=torch.float64))
    pos = torch.arange(6)
    close = dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(capped.fold_slope(), exact.fold_slope(), **close)
    torch.testing.assert_close(capped.fold(pos, pos).slope, exact.fold(pos, pos).slope, **close)
    torch.testing.assert_close(capped.log_prior(pos, pos), exact.log_prior(pos, pos), **close)
    assert capped.slope_bound() == 0.25 and GOAT(2, 2, slope="none").slope_bound() == 0.0


def test_goat_uniform_init_is_standard_attention():
    """Exactly, but for a learned slope's start softplus(-30) = 1e-13 per token of lag (softplus never
    reaches 0; goat-attention starts it there too)."""
    K = GOAT(4, 8, slope="none", init="uniform").log_prior(*grid(9, 9, offset=100))
    assert torch.equal(K, torch.zeros_like(K))
    for slope in ("none", "fixed"):  # without a learned slope the default start is the uniform one
        seeded, uniform = GOAT(4, 8, slope=slope), GOAT(4, 8, slope=slope, init="uniform")
        assert torch.equal(seeded.log_prior(*grid(9, 9)), uniform.log_prior(*grid(9, 9))), slope
    K = GOAT(4, 8, init="uniform").log_prior(*grid(9, 9, offset=100))
    assert K.abs().max() < 1e-10  # lags up to ~100


def test_goat_seeded_init_is_alibi_slopes_and_nothing_else():
    """goat-attention's default start: ``softplus(slope_raw)`` = ALiBi's ``2^(-8h/H)``, every other
    parameter at its uniform start (spectral weights 0, sink 0), so K = -m_h |i - j|."""
    H = 4
    torch.manual_seed(0)  # the sink MLP's first layer is drawn
    seeded = GOAT(H, 8)
    torch.manual_seed(0)
    uniform = GOAT(H, 8, init="uniform")
    slopes = torch.tensor([2.0 ** (-8 * h / H) for h in range(1, H + 1)])
    torch.testing.assert_close(F.softplus(seeded.slope_raw), slopes, rtol=1e-6, atol=0)
    uniform_state = uniform.state_dict()
    for name, value in seeded.state_dict().items():
        if name != "slope_raw":
            assert torch.equal(value, uniform_state[name]), name
    q_pos, k_pos = grid(9, 9, offset=100)
    expected = -slopes[:, None, None] * (q_pos[:, None] - k_pos[None, :]).abs()
    torch.testing.assert_close(seeded.log_prior(q_pos, k_pos), expected, rtol=1e-6, atol=1e-5)


def test_goat_fixed_slope_attends_exactly_like_alibi():
    """Press et al.'s slopes for H = 8 heads, 2^(-8 h / H), and the bias -m_h |i - j|, written out
    here, in a dense causal softmax; GOAT's recency init through every route gives its output."""
    H, L, D = 8, 12, 4
    slopes = torch.tensor([2.0 ** (-8 * h / H) for h in range(1, H + 1)], dtype=torch.float64)
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    alibi = -slopes[:, None, None] * (i - j).abs()  # (H, L, L)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, H, L, D, generator=gen, dtype=torch.float64) for _ in range(3))
    logits = (q @ k.transpose(-1, -2) / math.sqrt(D) + alibi).masked_fill(j > i, -math.inf)
    expected = torch.softmax(logits, -1) @ v
    fixed, learned = GOAT(H, 8, slope="fixed").double(), GOAT(H, 8, init="alibi").double()
    for backend in ("reference", "sdpa", "memeff"):
        out = priorattn.attention(q, k, v, prior=fixed, backend=backend)
        assert torch.allclose(out, expected, rtol=0, atol=1e-12), backend
        # a learned slope starts at softplus(softplus^-1(m)), its raw value rounded to float32
        out = priorattn.attention(q, k, v, prior=learned, backend=backend)
        assert torch.allclose(out, expected, rtol=0, atol=1e-6), backend


def test_goat_recency_without_slope_approximates_alibi_under_causal_mask():
    L = 256
    goat = GOAT(4, 16, slope=False, init="alibi", train_len=L).double()
    q_pos, k_pos = grid(L, L)
    causal = k_pos[None, :] <= q_pos[:, None]
    probs = torch.softmax(goat.log_prior(q_pos, k_pos).masked_fill(~causal, -torch.inf), -1)
    target = torch.softmax(ALiBi(4).double().log_prior(q_pos, k_pos).masked_fill(~causal, -torch.inf), -1)
    # Total-variation distance between the induced causal priors, averaged over rows.
    tv = 0.5 * (probs - target).abs().sum(-1).mean()
    assert tv < 1e-4


def test_goat_learnable_freqs_get_the_reference_gradient_through_every_route():
    """Open question 2 of the paper: frequencies as parameters, exact through the fold too."""
    grads = {}
    for backend in ("reference", "sdpa", "memeff"):
        prior = GOAT(2, 3, learnable_freqs=True, init="alibi").double()
        assert isinstance(prior.freqs, torch.nn.Parameter)
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 2, 12, 4, generator=gen, dtype=torch.float64) for _ in range(3))
        with torch.no_grad():
            prior.alpha.normal_(generator=gen)
        out = priorattn.attention(q, k, v, prior=prior, backend=backend)
        (grads[backend],) = torch.autograd.grad((out * out).sum(), prior.freqs)
    assert grads["reference"].abs().sum() > 0
    for backend in ("sdpa", "memeff"):
        assert torch.allclose(grads[backend], grads["reference"], atol=1e-10)


@pytest.mark.parametrize("name", [*VARIANTS, "sum"])
def test_goat_score_terms_are_by_lag_and_by_key_with_no_dense_values(name):
    """GOAT (alone or in a sum with ALiBi) is not relative with a sink, yet its ``score_mod`` holds
    no ``Lq x Lk`` values: its relative part by lag, its sink by key."""
    prior, pos = make_prior(name, 4), torch.arange(30, 40)[None]
    terms = prior.score_terms(pos, pos, torch.arange(-9, 10))
    assert terms.dense is None and terms.by_lag is not None
