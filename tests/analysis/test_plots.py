"""The arrays the figures draw, against the seeds' formulas computed by hand here."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from priorattn.analysis.plots import (
    causal_prior_probs,
    ggd,
    goat_components,
    illustrative_goat,
    plot_priors,
    prior_curve,
    prior_matrices,
)
from priorattn.priors import GGD, ALiBi, Uniform, alibi_slopes


def softmax_by_hand(logits):
    top = max(logits)
    weights = [math.exp(x - top) for x in logits]
    return [w / sum(weights) for w in weights]


def check_curve(offsets, K, probs, query, log_prior_of_offset):
    assert offsets.tolist() == [j - query for j in range(len(offsets))]
    expected = [log_prior_of_offset(d) for d in offsets.tolist()]
    assert K == pytest.approx(expected, rel=1e-9, abs=1e-12)
    visible = softmax_by_hand(expected[: query + 1])
    assert probs[: query + 1] == pytest.approx(visible, rel=1e-9, abs=1e-15)
    assert (probs[query + 1 :] == 0).all()


@pytest.mark.parametrize("head", [0, 2])
def test_alibi_curve_is_minus_slope_times_distance(head):
    length, query = 11, 6
    slope = alibi_slopes(4)[head].item()
    offsets, K, probs = prior_curve(ALiBi(4).double(), length, query, head)
    check_curve(offsets, K, probs, query, lambda d: -slope * abs(d))


@pytest.mark.parametrize(
    "theta", [(-1.0, 1.5, 0.3), (0.4, -0.6, -0.8), (-2.0, 0.5, 0.0)], ids=["pos", "neg", "heavy"]
)
def test_ggd_curve_matches_seed_003_app_c(theta):
    ta, tb, tm = theta
    prior = GGD(3, trainable=("alpha", "beta", "mu")).double()
    with torch.no_grad():
        prior.theta_alpha[1], prior.theta_beta[1], prior.theta_mu[1] = ta, tb, tm

    def by_hand(d, eps=1e-5):  # b_ij = -e^{ta} (|(j - i) - (e^{tm} - e^{-tm})| + eps)^{tb}
        return -math.exp(ta) * (abs(d - (math.exp(tm) - math.exp(-tm))) + eps) ** tb

    offsets, K, probs = prior_curve(prior, 13, 8, head=1)
    check_curve(offsets, K, probs, 8, by_hand)


def test_uniform_curve_spreads_evenly_over_visible_keys():
    _, K, probs = prior_curve(Uniform(), 10, 4, head=3)
    assert (K == 0).all()
    assert probs.tolist() == pytest.approx([0.2] * 5 + [0.0] * 5)


@pytest.fixture
def float64():
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(dtype)


@pytest.mark.parametrize("beta, mu", [(2.0, 0.0), (0.5, -3.0), (-0.5, 1.0)])
def test_ggd_factory_sets_shape_scale_and_location(float64, beta, mu):
    scale = 4.0
    offsets, K, _ = prior_curve(ggd(2, beta, scale, mu), 12, 6)
    gap = np.abs(offsets - mu) + 1e-5
    assert K == pytest.approx(-((gap / scale) ** beta), rel=1e-6)


def test_query_outside_the_sequence_is_rejected():
    with pytest.raises(ValueError, match=r"query must be in \[0, 5\), got 5"):
        prior_curve(Uniform(), 5, 5)


def test_causal_prior_probs_rows_sum_to_one_below_the_diagonal():
    probs = causal_prior_probs(torch.randn(2, 7, 7, dtype=torch.float64))
    assert torch.allclose(probs.sum(-1), torch.ones(2, 7, dtype=torch.float64))
    assert (probs.triu(1) == 0).all()


def test_goat_components_add_up_and_relative_part_is_toeplitz():
    length = 24
    u, relative, K = goat_components(illustrative_goat(4, length).double(), length, head=1)
    assert np.allclose(u[None, :] + relative, K)
    for lag in range(-length + 1, length):
        assert np.ptp(np.diagonal(relative, lag)) < 1e-8


def test_goat_figure_shows_a_sink_for_the_first_quarter_of_queries_then_recency():
    """What the decomposition and heatmap figures draw: the causal prior of the first quarter of the
    queries peaks at key 0 (the sink), later ones at their own position (recency); u is one key wide."""
    length = 64
    prior = illustrative_goat(4, length).double()
    _, probs = prior_matrices(prior, length, head=2)
    favourite, queries = probs.argmax(-1), np.arange(length)
    sink_rows, recency_rows = queries < length / 4 - 1, queries > length / 4 + 1
    assert (favourite[sink_rows] == 0).all()
    assert (favourite[recency_rows] == queries[recency_rows]).all()
    u, _, _ = goat_components(prior, length, head=2)
    assert np.abs(u[1:]).max() < 1e-3 < u[0]


def test_illustrative_goat_fits_recency_on_visible_keys():
    length = 32
    K, probs = prior_matrices(illustrative_goat(2, length, sink=False).double(), length, head=1)
    i, j = np.tril_indices(length)
    centred = K - K[:, :1]  # row shifts don't matter: -m (i - j) = m j + a row constant
    assert np.allclose(centred[i, j], alibi_slopes(2)[1].item() * j, atol=1e-6)
    assert np.allclose(probs.sum(-1), 1.0)


def test_plot_priors_rejects_a_head_it_does_not_have(tmp_path):
    with pytest.raises(ValueError, match=r"head must be in \[0, 2\), got 2"):
        plot_priors(tmp_path, length=16, num_heads=2, head=2)
