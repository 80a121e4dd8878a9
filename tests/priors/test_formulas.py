"""Each prior's log-prior against its formula in the seed, computed independently here."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from factories import make_prior
from test_fire import fire_by_hand
from test_kerple import kerple_by_hand
from test_sandwich import sandwich_by_hand
from test_t5 import t5_bucket_by_hand

import priorattn
from priorattn.priors import (
    FIRE,
    GGD,
    GOAT,
    KERPLE,
    ALiBi,
    GOATSink,
    Sandwich,
    Sum,
    T5Bias,
    Uniform,
    alibi_slopes,
)
from priorattn.priors.base import module_tensors
from priorattn.priors.math import inverse_softplus


def grid(Lq, Lk, offset=0):
    return torch.arange(offset, offset + Lq), torch.arange(Lk)


def test_alibi_slopes_match_press_et_al():
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0**-i for i in range(1, 9)], dtype=torch.float64))
    # Non power of two: first the 4-head sequence, then every other slope of the 8-head one.
    expected = [0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125]
    assert alibi_slopes(6).tolist() == expected


def test_alibi_log_prior_is_minus_slope_times_distance():
    prior = ALiBi(4).double()
    q_pos, k_pos = grid(5, 9, offset=4)
    K = prior.log_prior(q_pos, k_pos)
    for h, m in enumerate(alibi_slopes(4).tolist()):
        for i, qi in enumerate(q_pos.tolist()):
            for j, kj in enumerate(k_pos.tolist()):
                assert K[h, i, j].item() == pytest.approx(-m * abs(qi - kj))


def ggd_by_hand(ta, tb, tm, i, j, eps=1e-5):
    # seed 003 App. C: b_ij = -e^{ta} (|(j - i) - (e^{tm} - e^{-tm})| + eps)^{tb}
    return -math.exp(ta) * (abs((j - i) - (math.exp(tm) - math.exp(-tm))) + eps) ** tb


@pytest.mark.parametrize("name", ["ggd", "ggd_negative"])
def test_ggd_matches_appendix_c(name):
    prior = make_prior(name, 3, seed=5)
    q_pos, k_pos = grid(6, 10, offset=3)
    K = prior.log_prior(q_pos, k_pos)
    for h in range(3):
        ta, tb, tm = (p[h].item() for p in (prior.theta_alpha, prior.theta_beta, prior.theta_mu))
        for i, qi in enumerate(q_pos.tolist()):
            for j, kj in enumerate(k_pos.tolist()):
                assert K[h, i, j].item() == pytest.approx(ggd_by_hand(ta, tb, tm, qi, kj), rel=1e-12)


def test_ggd_uniform_init_is_constant_and_alibi_init_is_alibi():
    q_pos, k_pos = grid(7, 7)
    assert torch.equal(GGD(4).double().log_prior(q_pos, k_pos), -torch.ones(4, 7, 7, dtype=torch.float64))
    ggd = GGD(4, init="alibi").double()
    assert torch.allclose(ggd.log_prior(q_pos, k_pos), ALiBi(4).double().log_prior(q_pos, k_pos), atol=1e-5)


def test_ggd_trainable_selects_parameters():
    prior = GGD(2, trainable=("beta",))
    assert [n for n, p in prior.named_parameters() if p.requires_grad] == ["theta_beta"]
    with pytest.raises(ValueError, match="gamma"):
        GGD(2, trainable=("gamma",))
    with pytest.raises(ValueError, match="init"):
        GGD(2, init="laplace")


def test_ggd_negative_beta_is_finite_with_finite_gradients():
    prior = GGD(2, trainable=("alpha", "beta", "mu")).double()
    with torch.no_grad():
        prior.theta_beta.fill_(-1.5)  # at j - i = mu the base is eps: (1e-5)^-1.5 ~ 3e7
    q_pos, k_pos = grid(16, 16)
    K = prior.log_prior(q_pos, k_pos)
    assert torch.isfinite(K).all()
    K.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in prior.parameters())
    # Inverted prior: distant keys are preferred over the diagonal (seed 003 Theorem 3).
    assert K[0, 15, 0] > K[0, 15, 14]


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
        if isinstance(sink, GOATSink):  # per head, with a linear decay
            total += out[h].item() - sink.decay[h].item() * j / sink.train_len
        else:  # shared, times a per-head gain, plus a per-head bump at j = 0
            total += sink.gain[h].item() * out[0].item() + sink.bump[h].item() * (j == 0)
    if prior.slope_raw is not None:  # m = softplus(raw)
        total -= math.log1p(math.exp(prior.slope_raw[h].item())) * abs(i - j)
    elif prior.slopes is not None:  # fixed
        total -= prior.slopes[h].item() * abs(i - j)
    return total


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


@pytest.mark.parametrize("name", ["goat", "ggd", "ggd_negative"])
def test_log_prior_outside_autograd_reads_tables_that_follow_the_parameters(name):
    """Outside autograd (generation) GOAT's sink and lag terms and GGD's lag terms come from
    ``PositionTable``s; they grow past their end and are rebuilt when a parameter changes in place or
    is replaced, so the log-prior always equals its evaluation under autograd, which uses no table."""
    prior = make_prior(name, 2, seed=5)
    tables = [prior.by_lag] + ([prior.sink.by_position] if name == "goat" else [])
    cases = [(torch.arange(3, 5), torch.arange(5)), (torch.arange(11, 12), torch.arange(12))]
    cases += [(torch.tensor([[7], [40]]), torch.tensor([[0, 3, 7], [2, 2, 40]]))]  # per sequence
    cases += [(torch.arange(-3, 4), torch.arange(-3, 4))]  # negative positions and lags: evaluated
    cases += [(torch.tensor([10**6]), torch.tensor([0, 10**6]))]  # far: evaluated, no table to 10^6

    def check():
        for q_pos, k_pos in cases:
            expected = prior.log_prior(q_pos, k_pos)  # under autograd: evaluated
            with torch.no_grad():
                torch.testing.assert_close(prior.log_prior(q_pos, k_pos), expected, rtol=0, atol=1e-12)

    check()
    assert all(12 <= table.values.shape[-1] < 10**6 for table in tables)  # grown from 5 to 12, no further
    first = next(p for p in prior.parameters() if p.requires_grad)
    with torch.no_grad():
        first.add_(0.25)  # an optimizer step: in place
    check()
    last = list(prior.named_parameters())[-1][0].rsplit(".", 1)
    owner = prior.get_submodule(last[0]) if len(last) == 2 else prior
    setattr(owner, last[-1], torch.nn.Parameter(getattr(owner, last[-1]).detach() + 0.5))  # replaced
    check()


@pytest.mark.parametrize("name", ["alibi", "ggd", "goat", "sum"])
def test_module_tensors_are_the_parameters_and_buffers(name):
    """What a table's staleness check reads: every parameter and buffer, submodules' included."""
    prior = make_prior(name, 2)
    prior.register_parameter("unset", None)  # registered as None: no tensor
    prior.register_module("absent", None)
    expected = {id(t) for t in (*prior.parameters(), *prior.buffers())}
    assert {id(t) for t in module_tensors(prior)} == expected


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


@pytest.mark.parametrize("name", ["alibi", "ggd", "ggd_negative", "goat", "goat_noslope", "sum"])
def test_log_prior_of_runs_equals_log_prior_and_reads_table_views(name):
    """A decode step's tile from ``log_prior_of_runs``: outside autograd views of the priors'
    tables (a falling run of lags, the sink's rising run of keys), as the log-prior evaluated under
    autograd; also where the tables grow, after a parameter changes, for several queries, and for
    negative lags or far positions, which are evaluated."""
    prior = make_prior(name, 2, seed=7)
    runs = [(4, 1, 0, 5), (11, 3, 0, 14), (40, 1, 0, 41), (3, 2, 5, 4), (10**6, 1, 10**6 - 3, 4)]

    def check():
        for q_start, Lq, k_start, Lk in runs:
            q_pos, k_pos = torch.arange(q_start, q_start + Lq), torch.arange(k_start, k_start + Lk)
            expected = prior.log_prior(q_pos, k_pos)  # under autograd: evaluated
            with torch.no_grad():
                tile = prior.log_prior_of_runs(q_start, Lq, k_start, Lk, q_pos.device, torch.float64)
                tile32 = prior.log_prior_of_runs(q_start, Lq, k_start, Lk, q_pos.device, torch.float32)
            torch.testing.assert_close(tile, expected, rtol=0, atol=1e-12)
            assert tile32.dtype == torch.float32  # the float64 prior's values, cast
            torch.testing.assert_close(tile32, expected.float(), rtol=1e-6, atol=1e-6)

    check()
    if name in ("alibi", "ggd", "ggd_negative"):  # the whole tile is one view of the reversed table
        with torch.no_grad():
            tile = prior.log_prior_of_runs(40, 1, 0, 41, torch.device("cpu"), torch.float32)
        copy = prior.by_lag.copies[torch.float32, True]
        assert tile.untyped_storage().data_ptr() == copy.untyped_storage().data_ptr()
    learnable = [p for p in prior.parameters() if p.requires_grad]
    if learnable:
        with torch.no_grad():
            learnable[0].add_(0.25)  # an optimizer step: tables and their reversed copies are stale
        check()


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


def test_alibi_slope_bound_follows_construction_and_loading():
    prior = ALiBi(2)
    assert prior.slope_bound() == 2.0**-4
    prior.load_state_dict({"slopes": torch.tensor([1.5, -2.0])})
    assert prior.slope_bound() == 2.0


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
    fixed, learned = GOAT(H, 8, slope="fixed").double(), GOAT(H, 8, init="recency").double()
    for backend in ("reference", "sdpa", "memeff"):
        out = priorattn.attention(q, k, v, prior=fixed, backend=backend)
        assert torch.allclose(out, expected, rtol=0, atol=1e-12), backend
        # a learned slope starts at softplus(softplus^-1(m)), its raw value rounded to float32
        out = priorattn.attention(q, k, v, prior=learned, backend=backend)
        assert torch.allclose(out, expected, rtol=0, atol=1e-6), backend


def test_goat_recency_without_slope_approximates_alibi_under_causal_mask():
    L = 256
    goat = GOAT(4, 16, slope=False, init="recency", train_len=L).double()
    q_pos, k_pos = grid(L, L)
    causal = k_pos[None, :] <= q_pos[:, None]
    probs = torch.softmax(goat.log_prior(q_pos, k_pos).masked_fill(~causal, -torch.inf), -1)
    target = torch.softmax(ALiBi(4).double().log_prior(q_pos, k_pos).masked_fill(~causal, -torch.inf), -1)
    # Total-variation distance between the induced causal priors, averaged over rows.
    tv = 0.5 * (probs - target).abs().sum(-1).mean()
    assert tv < 1e-4


def test_sum_adds_log_priors():
    a, b = make_prior("alibi", 3), make_prior("goat", 3, seed=2)
    q_pos, k_pos = grid(5, 8, offset=3)
    assert torch.allclose(
        Sum(a, b).log_prior(q_pos, k_pos), a.log_prior(q_pos, k_pos) + b.log_prior(q_pos, k_pos)
    )
    with pytest.raises(ValueError, match="head counts"):
        Sum(ALiBi(2), ALiBi(3))


def test_uniform_is_zero():
    assert torch.equal(Uniform().log_prior(*grid(3, 4)), torch.zeros(1, 3, 4))


def log_prior_by_hand(prior, h, i, j):
    """``K_h(i, j)`` of any prior from the formulas above, one cell at a time."""
    if isinstance(prior, Uniform):
        return 0.0
    if isinstance(prior, ALiBi):
        return -alibi_slopes(prior.num_heads)[h].item() * abs(i - j)
    if isinstance(prior, GGD):
        return ggd_by_hand(
            *(p[h].item() for p in (prior.theta_alpha, prior.theta_beta, prior.theta_mu)), i, j
        )
    if isinstance(prior, GOAT):
        return goat_by_hand(prior, i, j, h)
    if isinstance(prior, T5Bias):
        options = (prior.bidirectional, prior.num_buckets, prior.max_distance)
        return prior.bias[h, t5_bucket_by_hand(i, j, *options)].item()
    if isinstance(prior, KERPLE):
        return kerple_by_hand(prior.variant, prior.r1[h].item(), prior.r2[h].item(), i, j)
    if isinstance(prior, Sandwich):
        return sandwich_by_hand(h, prior.num_heads, prior.dim, i, j)
    if isinstance(prior, FIRE):
        return fire_by_hand(prior, h, i, j)
    if isinstance(prior, Sum):
        return sum(log_prior_by_hand(part, h, i, j) for part in prior.parts)
    raise TypeError(prior)


def test_batched_positions_give_each_row_its_own_log_prior(prior_name):
    prior = make_prior(prior_name, 2)
    q_pos = torch.tensor([[3, 4], [10, 11]])
    k_pos = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])
    K = prior.log_prior(q_pos, k_pos)
    assert K.shape[0] == 2 and K.shape[-2:] == (2, 5)
    for b in range(2):
        expected = [
            [[log_prior_by_hand(prior, h, i, j) for j in k_pos[b].tolist()] for i in q_pos[b].tolist()]
            for h in range(2)
        ]
        assert torch.allclose(
            K[b].expand(2, 2, 5), torch.tensor(expected, dtype=K.dtype), rtol=1e-12, atol=1e-12
        )


def test_goat_learnable_freqs_get_the_reference_gradient_through_every_route():
    """Open question 2 of the paper: frequencies as parameters, exact through the fold too."""
    grads = {}
    for backend in ("reference", "sdpa", "memeff"):
        prior = GOAT(2, 3, learnable_freqs=True, init="recency").double()
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


def test_alibi_keeps_the_precision_of_floating_slopes():
    assert ALiBi(2, slopes=torch.tensor([0.1, 1 / 3], dtype=torch.float64)).slopes.dtype == torch.float64
    assert ALiBi(2, slopes=[1, 2]).slopes.dtype == torch.get_default_dtype()
