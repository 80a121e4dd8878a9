"""Sandwich: its bias against the paper's sum of cosines written out here, its fold, options, routes."""

from __future__ import annotations

import math

import pytest
import torch
from factories import ROUTE_CASES, route_case
from functional.test_routes import check_route

import priorattn
from priorattn.functional import api
from priorattn.priors import Sandwich, build_prior, canonical_spec

#: The shared tests' Sandwiches (tests/factories.py), which have no parameters: folded into 4 lanes,
#: and read from a lag table.
RANDOM_PRIORS = {
    "sandwich": lambda heads, rand: Sandwich(heads, dim=4, fold=True),
    "sandwich_table": lambda heads, rand: Sandwich(heads, dim=16),
}


def sandwich_by_hand(h, H, dim, i, j):
    """Chi et al. (2023) Sec. 5: sum_k cos((i - j) / 10000^(2k / d)), divided by r_h = 8 (h + 1) / H."""
    total = sum(math.cos((i - j) / 10_000 ** (2 * k / dim)) for k in range(dim // 2))
    return total / (8 * (h + 1) / H)


def log_prior_by_hand(prior, h, i, j):
    return sandwich_by_hand(h, prior.num_heads, prior.dim, i, j)


@pytest.mark.parametrize("fold", [False, True])
def test_sandwich_log_prior_is_the_papers_sum_of_cosines(fold):
    H, dim = 4, 10
    prior = Sandwich(H, dim, fold).double()
    q_pos, k_pos = torch.arange(10**6, 10**6 + 6), torch.arange(10**6 - 40, 10**6 + 9, 3)
    K = prior.log_prior(q_pos, k_pos)
    for h in range(H):
        for i, qi in enumerate(q_pos.tolist()):
            for j, kj in enumerate(k_pos.tolist()):
                assert K[h, i, j].item() == pytest.approx(
                    sandwich_by_hand(h, H, dim, qi, kj), rel=1e-12, abs=1e-12
                )


def test_sandwich_is_largest_at_lag_zero_and_the_papers_default_width():
    prior = Sandwich(8).double()
    K = prior.log_prior(torch.tensor([500]), torch.arange(501))[:, 0]  # (H, 501)
    assert torch.equal(K.argmax(-1), torch.full((8,), 500))
    assert K[0, -1].item() == pytest.approx(64 / 1)  # d/2 cosines of 0, over r_1 = 8 / 8


@pytest.mark.parametrize("offset", [0, 10**7])
def test_sandwich_fold_equals_its_log_prior_at_any_position(offset):
    prior = Sandwich(3, dim=12, fold=True).double()
    q_pos, k_pos = torch.arange(offset + 5, offset + 15), torch.arange(offset, offset + 20)
    lanes = prior.fold(q_pos, k_pos)
    assert lanes.key_bias is None and lanes.slope is None and prior.fold_width == 12
    folded = lanes.q @ lanes.k.transpose(-1, -2)
    # the angles w i and w j are rounded in float64 (2^-52 of 10^7 is 2e-9 rad); w (i - j) is not
    tol = 1e-12 if offset == 0 else 1e-9
    torch.testing.assert_close(folded, prior.log_prior(q_pos, k_pos), rtol=0, atol=tol)


def test_sandwich_routes_and_auto():
    """Folded: auto takes sdpa under any mask. Read by lag: memeff on the CPU, sdpa refuses it."""
    folded, table = Sandwich(2, 8, fold=True), Sandwich(2, 8)
    assert folded.can_fold(True) and folded.can_fold(False) and folded.slope_bound() == 0.0
    assert not table.can_fold(True) and table.fold_width is None and table.slope_bound() == 0.0
    q = torch.randn(1, 2, 300, 8)
    with pytest.raises(ValueError, match="folds into q/k lanes"):
        priorattn.attention(q, q, q, prior=table, backend="sdpa")
    with pytest.raises(TypeError, match="fold=True"):
        table.fold(torch.arange(3), torch.arange(3))
    chosen = []
    for name in ("sdpa", "memeff"):
        api.ROUTES[name], saved = (lambda *a, name=name: chosen.append(name)), api.ROUTES[name]
        try:
            priorattn.attention(q, q, q, prior=folded if name == "sdpa" else table, causal=False)
        finally:
            api.ROUTES[name] = saved
    assert chosen == ["sdpa", "memeff"]


def test_sandwich_spec_round_trips():
    prior = build_prior("sandwich(dim=16, fold=true)", 4)
    assert isinstance(prior, Sandwich) and prior.dim == 16 and prior.folds
    assert canonical_spec(prior.spec()) == "sandwich(dim=16, fold=true)"
    assert list(prior.parameters()) == [] and prior.state_dict() == {}


@pytest.mark.parametrize(
    "kwargs, name",
    [(dict(num_heads=0), "num_heads"), (dict(dim=7), "dim"), (dict(dim=0), "dim"), (dict(fold=1), "fold")],
)
def test_sandwich_bad_options_are_one_line_errors(kwargs, name):
    with pytest.raises(ValueError, match=name) as error:
        Sandwich(**{"num_heads": 2, **kwargs})
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", ROUTE_CASES)
@pytest.mark.parametrize("prior", ["sandwich", "sandwich_table"])
def test_sandwich_on_every_route_that_takes_it_matches_reference(prior, case, dtype):
    backends = ["sdpa_bias"] if case.startswith("decode") else ["memeff"]
    backends += ["sdpa"] if prior == "sandwich" and not case.startswith("decode") else []
    for backend in backends:
        check_route(backend, route_case(case, prior), dtype)
