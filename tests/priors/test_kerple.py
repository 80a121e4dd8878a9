"""KERPLE: both variants against the paper's kernels written out here, constraints, options, routes."""

from __future__ import annotations

import math

import pytest
import torch
from factories import ROUTE_CASES, make_prior, route_case
from functional.test_routes import check_route

import priorattn
from priorattn.functional import api
from priorattn.priors import KERPLE, build_prior, canonical_spec

#: The shared tests' KERPLEs (tests/factories.py): both variants, their parameters drawn.
RANDOM_PRIORS = {
    f"kerple_{variant}": lambda heads, rand, variant=variant: rand.fill(KERPLE(heads, variant=variant))
    for variant in ("log", "power")
}


def kerple_by_hand(variant, r1, r2, i, j):
    """Chi et al. (2022) Sec. 4: -r1 log(1 + r2 |m - n|), or -r1 |m - n|^r2."""
    if variant == "log":
        return -r1 * math.log(1 + r2 * abs(i - j))
    return -r1 * abs(i - j) ** r2


def log_prior_by_hand(prior, h, i, j):
    return kerple_by_hand(prior.variant, prior.r1[h].item(), prior.r2[h].item(), i, j)


@pytest.mark.parametrize("variant", ["log", "power"])
def test_kerple_log_prior_is_the_papers_kernel(variant):
    prior = make_prior(f"kerple_{variant}", 3, seed=2)
    q_pos, k_pos = torch.arange(995, 1003), torch.arange(-4, 1010, 37)
    K = prior.log_prior(q_pos, k_pos)
    for h in range(3):
        # the constraints by parameterization: softplus, and 2 sigmoid for the power's exponent
        r1 = math.log1p(math.exp(prior.theta_r1[h].item()))
        t = prior.theta_r2[h].item()
        r2 = math.log1p(math.exp(t)) if variant == "log" else 2 / (1 + math.exp(-t))
        for i, qi in enumerate(q_pos.tolist()):
            for j, kj in enumerate(k_pos.tolist()):
                assert K[h, i, j].item() == pytest.approx(kerple_by_hand(variant, r1, r2, qi, kj), rel=1e-12)


def test_kerple_parameters_stay_in_the_papers_range_wherever_they_are():
    prior = KERPLE(4, variant="power").double()
    with torch.no_grad():
        prior.theta_r1.copy_(torch.tensor([-50.0, -1.0, 1.0, 50.0]))
        prior.theta_r2.copy_(torch.tensor([-50.0, -1.0, 1.0, 50.0]))
    assert (prior.r1 > 0).all() and (prior.r2 > 0).all() and (prior.r2 <= 2).all()
    # d^r2 at d = 0: finite, and a finite gradient for r2
    prior.log_prior(torch.arange(3), torch.arange(3)).sum().backward()
    assert torch.isfinite(prior.theta_r2.grad).all() and torch.isfinite(prior.theta_r1.grad).all()


@pytest.mark.parametrize("variant, r1_high, r2_high", [("log", 2.0, 1.0), ("power", 1.0, 2.0)])
def test_kerple_starts_in_the_authors_ranges(variant, r1_high, r2_high):
    prior = KERPLE(64, variant=variant)
    assert (prior.r1 > 0).all() and (prior.r1 < r1_high).all()
    assert (prior.r2 > 0).all() and (prior.r2 < r2_high).all()
    assert prior.r1.std() > 0.1 and prior.r2.std() > 0.1  # spread over the heads


def test_kerple_spec_round_trips():
    prior = build_prior("kerple(variant=power)", 4)
    assert isinstance(prior, KERPLE) and prior.variant == "power"
    assert canonical_spec(prior.spec()) == "kerple(variant=power)"
    assert canonical_spec(build_prior("kerple", 2).spec()) == "kerple"


@pytest.mark.parametrize("kwargs, name", [(dict(num_heads=0), "num_heads"), (dict(variant="exp"), "variant")])
def test_kerple_bad_options_are_one_line_errors(kwargs, name):
    with pytest.raises(ValueError, match=name) as error:
        KERPLE(**{"num_heads": 2, **kwargs})
    assert "\n" not in str(error.value)


def test_kerple_does_not_fold_and_auto_reads_it_from_the_lag_table(monkeypatch):
    prior = KERPLE(2)
    assert prior.is_relative and not prior.can_fold(True) and prior.fold_width is None
    calls = []
    monkeypatch.setitem(api.ROUTES, "memeff", lambda *a: calls.append("memeff"))
    q = torch.randn(1, 2, 300, 8)
    priorattn.attention(q, q, q, prior=prior)
    assert calls == ["memeff"]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", ROUTE_CASES)
@pytest.mark.parametrize("prior", ["kerple_log", "kerple_power"])
def test_kerple_on_memeff_and_the_decode_route_matches_reference(prior, case, dtype):
    backend = "sdpa_bias" if case.startswith("decode") else "memeff"
    check_route(backend, route_case(case, prior), dtype)
