"""The attention op with the maps of the variational family (seed 004 Sec. 4): the reference route
applies them to the logits, every prior included; the fast routes refuse them."""

from __future__ import annotations

import math

import pytest
import torch
from factories import make_prior
from hypothesis import given
from hypothesis import strategies as st

import priorattn
from priorattn.eot import KLToPrior, Tsallis, regularizer

SPECS = ["sparsemax", "entmax15", 1.3, Tsallis(2.5, tau=0.5)]


def dense_logits(q, k, log_prior, scale):
    """scale <q, k> + log-prior, grouped heads expanded, written out without the library's helpers."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    return scale * torch.einsum("bhid,bhjd->bhij", q, k) + log_prior


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_reference_route_applies_the_map_to_the_prior_logits(spec, prior_name):
    B, H, Hkv, L, D = 2, 4, 2, 11, 8
    q = torch.randn(B, H, L, D, dtype=torch.float64)
    k, v = (torch.randn(B, Hkv, L, D, dtype=torch.float64) for _ in range(2))
    prior = make_prior(prior_name, H)
    pos = torch.arange(L)
    log_prior = (
        prior.log_prior(pos, pos) if prior_name != "uniform" else torch.zeros(L, L, dtype=torch.float64)
    )
    gate = prior.query_gate(q)  # GOAT's gate: g(q_i) K(i, j)
    log_prior = log_prior if gate is None else log_prior * gate
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    logits = dense_logits(q, k, log_prior, 1 / math.sqrt(D))
    p = regularizer(spec).normalize(logits, causal)
    expected = p @ v.repeat_interleave(H // Hkv, dim=1)
    for backend in ("reference", "auto"):
        out = priorattn.attention(q, k, v, prior=prior, normalizer=spec, backend=backend)
        torch.testing.assert_close(out, expected)


@given(
    spec=st.sampled_from(["sparsemax", "entmax15", 2.5]),
    Lq=st.integers(1, 6),
    extra=st.integers(0, 4),
    window=st.none() | st.integers(1, 4),
    padded=st.booleans(),
)
def test_masked_keys_get_no_weight_and_lonely_queries_give_zeros(spec, Lq, extra, window, padded):
    """With one-hot values the output is the weights themselves: zero at every masked key, rows
    summing to one, and zeros for a query that sees no key (with finite gradients)."""
    B, H, D, Lk = 2, 2, 4, Lq + extra
    q = torch.randn(B, H, Lq, D, dtype=torch.float64, requires_grad=True)
    k = torch.randn(B, H, Lk, D, dtype=torch.float64) * 3
    v = torch.eye(Lk, dtype=torch.float64).expand(B, H, Lk, Lk)
    padding = torch.zeros(B, Lk, dtype=torch.bool)
    if padded:
        padding[1] = True  # the whole second sequence is padding: none of its queries sees a key
    weights = priorattn.attention(q, k, v, window=window, key_padding_mask=padding, normalizer=spec)
    lag = torch.arange(Lk - Lq, Lk)[:, None] - torch.arange(Lk)[None]  # (Lq, Lk)
    visible = (lag >= 0) & (lag < (window or Lk))
    assert (weights[:, :, ~visible] == 0).all()
    ones = torch.ones(H, Lq, dtype=torch.float64)
    torch.testing.assert_close(weights[0].sum(-1), ones)
    if padded:
        assert (weights[1] == 0).all()
    weights.pow(2).sum().backward()
    assert torch.isfinite(q.grad).all()


@pytest.mark.parametrize("backend", ["sdpa", "memeff", "flex"])
def test_fast_routes_refuse_other_maps(backend):
    q = k = v = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match=f"backend='{backend}' computes softmax only"):
        priorattn.attention(q, k, v, normalizer="sparsemax", backend=backend)


def test_regularizer_with_position_terms_is_refused():
    q = k = v = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match="carries its own position terms: give the prior as prior="):
        priorattn.attention(q, k, v, normalizer=KLToPrior(torch.zeros(4, 4)))


def test_entmax_alpha_at_most_one_is_a_clear_error():
    q = k = v = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match="entmax alpha must be a finite number > 1"):
        priorattn.attention(q, k, v, normalizer=1.0)


def test_sparse_attention_gradcheck_with_a_prior():
    """Gradients of q, k, v and the prior's parameters through the entmax map, in float64."""
    q = torch.randn(1, 2, 5, 4, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(1, 2, 5, 4, dtype=torch.float64, requires_grad=True) for _ in range(2))
    prior = make_prior("goat", 2)
    params = list(prior.parameters())

    def f(q, k, v, *theta):
        return priorattn.attention(q, k, v, prior=prior, normalizer="entmax15")

    assert torch.autograd.gradcheck(f, (q, k, v, *params))
