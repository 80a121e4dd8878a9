"""FIRE: its bias against the paper's formula written out here, its routes, options, and errors."""

from __future__ import annotations

import math

import pytest
import torch
from factories import ROUTE_CASES, make_prior, route_case
from functional.test_routes import check_route

import priorattn
from priorattn.functional import api
from priorattn.priors import FIRE, build_prior, canonical_spec


def random_fire(heads, rand):
    """A FIRE of 4 hidden units with every parameter drawn, its threshold ``L`` at 6: a short test
    has queries on both sides of it."""
    prior = FIRE(heads, hidden=4, threshold=6.0)
    with torch.no_grad():
        for p in prior.parameters():
            p.copy_(rand(p.numel()).view_as(p))  # c and L are scalars
        prior.theta_L.fill_(6.0)
    return prior


#: The shared tests' FIRE (tests/factories.py).
RANDOM_PRIORS = {"fire": random_fire}


def softplus(x):
    return math.log1p(math.exp(x))


def fire_by_hand(prior, h, i, j):
    """Li et al. (2024) Sec. 3: f(psi(i - j) / psi(max(L, i))), psi(x) = log(c x + 1) (odd below 0),
    f a one-hidden-layer ReLU MLP, evaluated with Python floats."""
    c, L = softplus(prior.theta_c.item()), softplus(prior.theta_L.item())

    def psi(x):
        return math.copysign(math.log(c * abs(x) + 1), x)

    x = psi(i - j) / psi(max(L, i))
    w1, b1 = prior.mlp[0].weight[:, 0].tolist(), prior.mlp[0].bias.tolist()
    w2, b2 = prior.mlp[2].weight[h].tolist(), prior.mlp[2].bias[h].item()
    return b2 + sum(w * max(a * x + b, 0.0) for w, a, b in zip(w2, w1, b1))


def log_prior_by_hand(prior, h, i, j):
    return fire_by_hand(prior, h, i, j)


def test_fire_log_prior_is_the_papers_formula():
    prior = make_prior("fire", 3, seed=1)
    q_pos = torch.tensor([-3, 0, 2, 5, 6, 7, 40, 10**6])  # before and after the threshold L = 6
    k_pos = torch.tensor([-7, 0, 1, 4, 7, 39, 10**6 - 5])
    K = prior.log_prior(q_pos, k_pos)
    for h in range(3):
        for i, qi in enumerate(q_pos.tolist()):
            for j, kj in enumerate(k_pos.tolist()):
                assert K[h, i, j].item() == pytest.approx(
                    fire_by_hand(prior, h, qi, kj), rel=1e-12, abs=1e-12
                )


def test_fire_depends_on_the_query_not_only_the_lag_and_starts_flat():
    prior = make_prior("fire", 2)
    near, far = (
        prior.log_prior(torch.tensor([10]), torch.tensor([5])),
        prior.log_prior(torch.tensor([1000]), torch.tensor([995])),
    )
    assert not prior.is_relative and not torch.allclose(near, far)
    assert not FIRE(2).log_prior(torch.arange(9), torch.arange(9)).any()
    pos = torch.arange(5)[None]
    assert prior.score_terms(pos, pos, torch.arange(-4, 5)).dense is not None  # Lq x Lk values


def test_fire_routes_refuse_loudly_and_auto_takes_memeff(monkeypatch):
    prior = FIRE(2)
    assert not prior.can_fold(True) and not prior.can_fold(False) and prior.fold_width is None
    q = torch.randn(1, 2, 300, 8)
    with pytest.raises(ValueError, match="folds into q/k lanes"):
        priorattn.attention(q, q, q, prior=prior, backend="sdpa")
    with torch.no_grad(), pytest.raises(ValueError, match="backend='memeff'"):
        priorattn.attention(q, q, q, prior=prior, backend="flex")
    calls = []
    monkeypatch.setitem(api.ROUTES, "memeff", lambda *a: calls.append("memeff"))
    monkeypatch.setattr(api, "flex_trains_on", lambda device: True)  # as on CUDA: still memeff
    priorattn.attention(q, q, q, prior=prior)
    assert calls == ["memeff"]


def test_fire_spec_round_trips():
    prior = build_prior("fire(hidden=8, threshold=1024)", 4)
    assert isinstance(prior, FIRE) and prior.mlp[0].out_features == 8
    assert canonical_spec(prior.spec()) == "fire(hidden=8, threshold=1024.0)"


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(num_heads=0), "num_heads"),
        (dict(hidden=0), "hidden"),
        (dict(threshold=0.0), "threshold"),
        (dict(threshold=float("inf")), "threshold"),
    ],
)
def test_fire_bad_options_are_one_line_errors(kwargs, name):
    with pytest.raises(ValueError, match=name) as error:
        FIRE(**{"num_heads": 2, **kwargs})
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", ROUTE_CASES)
def test_fire_on_memeff_and_the_decode_route_matches_reference(case, dtype):
    backend = "sdpa_bias" if case.startswith("decode") else "memeff"
    check_route(backend, route_case(case, "fire"), dtype)
