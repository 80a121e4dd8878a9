"""T5's relative bias: its buckets against the formula written out here, its options, its routes."""

from __future__ import annotations

import math

import pytest
import torch
from factories import ROUTE_CASES, route_case
from functional.test_routes import check_route

import priorattn
from priorattn.functional import api
from priorattn.priors import T5Bias, build_prior, canonical_spec


def random_t5(bidirectional: bool):
    """``make(heads, rand)`` of a T5 bias with few, narrow buckets (8, up to distance 12), so that
    the lags of a short test reach the log-spaced and the last ones, its biases drawn."""
    return lambda heads, rand: rand.fill(
        T5Bias(heads, num_buckets=8, max_distance=12, bidirectional=bidirectional)
    )


#: The shared tests' T5 biases (tests/factories.py): a decoder's and an encoder's.
RANDOM_PRIORS = {"t5": random_t5(False), "t5_bidirectional": random_t5(True)}


def t5_bucket_by_hand(i, j, bidirectional, num_buckets, max_distance):
    """Raffel et al. (2020) Sec. 2.1 as their code buckets ``relative_position = j - i``."""
    relative, bucket = j - i, 0
    if bidirectional:
        num_buckets //= 2
        bucket += num_buckets if relative > 0 else 0
        n = abs(relative)
    else:
        n = -min(relative, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return bucket + n
    log_bucket = max_exact + int(
        math.log(n / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    )
    return bucket + min(log_bucket, num_buckets - 1)


def log_prior_by_hand(prior, h, i, j):
    options = (prior.bidirectional, prior.num_buckets, prior.max_distance)
    return prior.bias[h, t5_bucket_by_hand(i, j, *options)].item()


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("num_buckets, max_distance", [(32, 128), (8, 12), (6, 40)])
def test_t5_log_prior_is_the_bias_of_each_lags_bucket(bidirectional, num_buckets, max_distance):
    prior = T5Bias(3, num_buckets, max_distance, bidirectional).double()
    with torch.no_grad():
        prior.bias.copy_(torch.randn(prior.bias.shape, dtype=torch.float64))
    q_pos, k_pos = torch.arange(290, 300), torch.arange(-5, 305, 7)
    K = prior.log_prior(q_pos, k_pos)
    for i, qi in enumerate(q_pos.tolist()):
        for j, kj in enumerate(k_pos.tolist()):
            bucket = t5_bucket_by_hand(qi, kj, bidirectional, num_buckets, max_distance)
            assert torch.equal(K[:, i, j], prior.bias[:, bucket]), (qi, kj)


def test_t5_distances_past_max_distance_share_the_last_bucket_and_start_at_zero():
    prior = T5Bias(2)
    lags = torch.tensor([128, 1000, 10**7])
    assert prior.bucket(lags).tolist() == [31, 31, 31]
    assert prior.bucket(torch.tensor([-1, -100])).tolist() == [0, 0]  # causal: future keys in bucket 0
    assert not prior.log_prior(torch.arange(5), torch.arange(5)).any()


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("num_buckets, max_distance", [(32, 128), (8, 12), (4, 3), (2, 2)])
def test_t5_is_constant_from_its_horizon_on(bidirectional, num_buckets, max_distance):
    """``constant_beyond``: the first distance of the last bucket of past keys (by the formula
    written out above), and every farther distance in it."""
    if bidirectional and num_buckets < 4:
        pytest.skip("a bidirectional T5 needs 4 buckets")
    prior = T5Bias(2, num_buckets, max_distance, bidirectional)
    horizon = prior.constant_beyond()
    last = t5_bucket_by_hand(10**6, 0, bidirectional, num_buckets, max_distance)
    assert t5_bucket_by_hand(horizon - 1, 0, bidirectional, num_buckets, max_distance) != last
    for d in range(horizon, 5 * max_distance):
        assert t5_bucket_by_hand(d, 0, bidirectional, num_buckets, max_distance) == last, d
    assert 1 <= horizon <= max_distance


def test_t5_spec_round_trips():
    prior = build_prior("t5(num_buckets=16, bidirectional=true)", 4)
    assert isinstance(prior, T5Bias) and prior.num_buckets == 16 and prior.bidirectional
    assert canonical_spec(prior.spec()) == "t5(num_buckets=16, bidirectional=true)"
    assert prior.bias.shape == (4, 16)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(num_heads=0), "num_heads"),
        (dict(num_buckets=1), "num_buckets"),
        (dict(num_buckets=7, bidirectional=True), "num_buckets"),
        (dict(num_buckets=32, max_distance=16), "max_distance"),
        (dict(bidirectional="yes"), "bidirectional"),
    ],
)
def test_t5_bad_options_are_one_line_errors(kwargs, name):
    with pytest.raises(ValueError, match=name) as error:
        T5Bias(**{"num_heads": 2, **kwargs})
    assert "\n" not in str(error.value)


def test_t5_does_not_fold_and_auto_reads_it_from_the_lag_table(monkeypatch):
    """Relative but piecewise constant: no fold; ``auto`` takes ``memeff`` (its lag table) on the
    CPU, and ``sdpa`` refuses it."""
    prior = T5Bias(2)
    assert prior.is_relative and not prior.can_fold(True) and prior.fold_width is None
    q = torch.randn(1, 2, 300, 8)
    with pytest.raises(ValueError, match="folds into q/k lanes"):
        priorattn.attention(q, q, q, prior=prior, backend="sdpa")
    calls = []
    monkeypatch.setitem(api.ROUTES, "memeff", lambda *a: calls.append("memeff"))
    priorattn.attention(q, q, q, prior=prior)
    assert calls == ["memeff"]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", ROUTE_CASES)
@pytest.mark.parametrize("prior", ["t5", "t5_bidirectional"])
def test_t5_on_memeff_and_the_decode_route_matches_reference(prior, case, dtype):
    backend = "sdpa_bias" if case.startswith("decode") else "memeff"
    check_route(backend, route_case(case, prior), dtype)
