"""BAM's GGD: its bias against seed 003 App. C written out here, its starts and trainable parameters,
and a negative shape."""

from __future__ import annotations

import math

import pytest
import torch
from factories import grid, make_prior

from priorattn.priors import GGD, ALiBi


def random_ggd(negative: bool):
    """``make(heads, rand)`` of a GGD with every parameter trainable and drawn: ``theta_alpha`` about
    -1, ``theta_mu`` within 1/2, ``theta_beta`` about 1, or about -0.6 (``negative``: an inverted
    prior, seed 003 Theorems 3-4)."""

    def make(heads, rand):
        prior = GGD(heads, init="alibi", trainable=("alpha", "beta", "mu"))
        with torch.no_grad():
            prior.theta_alpha.copy_(rand(heads) - 1.0)
            prior.theta_beta.copy_(rand(heads, scale=0.5) + (-0.6 if negative else 1.0))
            prior.theta_mu.copy_(rand(heads, scale=0.5))
        return prior

    return make


#: The shared tests' GGDs (tests/factories.py): a recency and an inverted prior.
RANDOM_PRIORS = {"ggd": random_ggd(negative=False), "ggd_negative": random_ggd(negative=True)}


def ggd_by_hand(ta, tb, tm, i, j, eps=1e-5):
    # seed 003 App. C: b_ij = -e^{ta} (|(j - i) - (e^{tm} - e^{-tm})| + eps)^{tb}
    return -math.exp(ta) * (abs((j - i) - (math.exp(tm) - math.exp(-tm))) + eps) ** tb


def log_prior_by_hand(prior, h, i, j):
    thetas = (prior.theta_alpha, prior.theta_beta, prior.theta_mu)
    return ggd_by_hand(*(p[h].item() for p in thetas), i, j, prior.eps)


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
