"""Scalar, hybrid and mixed layers: cached decoding equals one full pass; the cache costs what it says."""

from __future__ import annotations

import pytest
import torch
from factories import make_prior

from priorattn.scalar import MixedCache, MixedMultiheadAttention, ScalarMultiheadAttention

CASES = {
    "scalar": dict(),
    "grouped_token_tau_sink": dict(value_groups=2, tau="token", sink=True, sink_key=0.5),
    "hybrid_rope_capped": dict(hybrid=True, encoding="rope", tau="global", tau_cap=1.0),
    "hybrid_goat": dict(hybrid=True, value_groups=1, prior="goat"),
    "token_tau_length_scaled_sink": dict(tau="token", tau_length_scaling=4, sink=True),  # 11 > T = 4
}


def layer(name: str) -> ScalarMultiheadAttention:
    options = dict(CASES[name])
    if "prior" in options:
        options["prior"] = make_prior(options["prior"], 4, seed=1, dtype=torch.float32)
    torch.manual_seed(0)
    module = ScalarMultiheadAttention(16, 4, **options)
    with torch.no_grad():  # random, non-trivial parameters everywhere (the sink starts at zero)
        for p in module.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return module


@pytest.mark.parametrize("name", sorted(CASES))
def test_cached_decoding_equals_full_pass(name):
    module = layer(name)
    x = torch.randn(2, 11, 16)
    doc_ids = torch.tensor([[0] * 5 + [1] * 6, [3] * 11])
    full, _ = module(x, doc_ids=doc_ids)
    y, cache = module(x[:, :6], doc_ids=doc_ids[:, :6])
    pieces = [y]
    for t in range(6, 11):
        y, cache = module(x[:, t : t + 1], doc_ids=doc_ids[:, t : t + 1], cache=cache)
        pieces.append(y)
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("name", sorted(CASES))
def test_cache_holds_the_floats_it_reports(name):
    """seed 002: G n d_v + H n floats per sequence (+ G n d_k vector keys in the hybrid)."""
    module = layer(name)
    _, cache = module(torch.randn(1, 7, 16))
    assert cache.k.numel() + cache.v.numel() == module.cache_floats(7)


def test_grouped_values_cost_g_value_heads():
    """H = 64 heads, G = 4 groups: 4 value heads plus 64 scalars per token (the seed's example)."""
    module = ScalarMultiheadAttention(256, 64, value_groups=4, head_dim=32)
    assert module.cache_floats(100) == 4 * 100 * 32 + 64 * 100


def test_mixed_layer_is_its_two_halves_added_and_decodes_from_its_cache():
    torch.manual_seed(0)
    module = MixedMultiheadAttention(16, 4, 1, prior=None, encoding="rope", tau="head")
    x = torch.randn(2, 9, 16)
    full, cache = module(x)
    assert isinstance(cache, MixedCache) and len(cache) == 9
    torch.testing.assert_close(full, module.dot(x)[0] + module.scalar(x)[0])
    y, cache = module(x[:, :4])
    pieces = [y]
    for t in range(4, 9):
        y, cache = module(x[:, t : t + 1], cache=cache)
        pieces.append(y)
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=2e-5, rtol=1e-4)


def test_pure_scalar_layer_matches_the_formula():
    """One head, one group: y = out_proj(softmax(-(q_s - k_s)^2 / tau) v), written out densely."""
    torch.manual_seed(0)
    module = ScalarMultiheadAttention(8, 1, tau="global", tau_init=0.3)
    x = torch.randn(1, 5, 8)
    y, _ = module(x)
    q_s, k_s, v = module.q_proj(x)[0, :, 0], module.k_proj(x)[0, :, 0], module.v_proj(x)[0]
    logits = -((q_s[:, None] - k_s[None, :]) ** 2) / 0.3
    logits = logits.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(y[0], module.out_proj(logits.softmax(-1) @ v), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(value_groups=3), "value_groups=3 does not divide num_heads=4"),
        (dict(encoding="rope"), "pure scalar heads have none"),
        (dict(tau_init=0.0), "tau init must be a finite number > 0.0001"),
        (dict(tau_init=1.0, tau_cap=0.5), "tau cap must be a finite number above init"),
        (dict(tau="layer"), "tau kind must be one of"),
        (dict(tau_length_scaling=0), "tau_length_scaling must be None or the training length"),
        (dict(tau_length_scaling=2.5), "tau_length_scaling must be None or the training length"),
    ],
)
def test_bad_layer_options_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        ScalarMultiheadAttention(16, 4, **options)


def test_cache_of_another_layout_is_refused():
    module = layer("scalar")
    _, cache = ScalarMultiheadAttention(16, 4, hybrid=True)(torch.randn(1, 3, 16))
    with pytest.raises(ValueError, match="cache keys are"):
        module(torch.randn(1, 1, 16), cache=cache)


@pytest.mark.parametrize("name", sorted(CASES))
def test_attention_map_gives_the_layer_its_output(name):
    """The map's weights (and the sink's) times the values, projected, are the layer's output."""
    module = layer(name)
    x = torch.randn(2, 9, 16)
    doc_ids = torch.tensor([[0] * 4 + [1] * 5, [2] * 9])
    expected, _ = module(x, doc_ids=doc_ids)
    attention = module.attention_map(x, doc_ids=doc_ids)
    H, G, D = module.num_heads, module.value_groups, module.head_dim
    v = module.v_proj(x).view(2, 9, G, D).transpose(1, 2).repeat_interleave(H // G, dim=1)  # (B, H, L, D)
    y = attention.weights @ v
    if module.sink_value is not None:
        y = y + attention.sink_weight[..., None] * module.sink_value.repeat_interleave(H // G, 0)[:, None]
    with torch.no_grad():
        torch.testing.assert_close(module.out_proj(y.transpose(1, 2).reshape(2, 9, H * D)), expected)
    assert attention.weights.shape == attention.distance().shape == (2, H, 9, 9)
    assert attention.tau.shape == attention.q_s.shape == (2, H, 9)
    assert not attention.weights[0, :, 4:, :4].any()  # the second document does not see the first
