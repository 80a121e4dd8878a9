"""Generation through the sorted scalar-key cache against the same model with its full KV cache."""

from __future__ import annotations

import pytest
import torch

from priorattn.models import GPT, GPTConfig
from priorattn.scalar import ScalarMultiheadAttention, SortedDecoding, SortedLayerCache
from priorattn.scalar.model import sorted_caches

LAYOUTS = {
    "scalar": dict(attention="scalar"),
    "grouped values, per-token tau": dict(attention="scalar", attention_options=dict(groups=2, tau="token")),
    "sink": dict(attention="scalar", attention_options=dict(sink=True)),
    "hybrid with rope": dict(attention="hybrid", encoding="rope"),
    "hybrid, tau length-scaled past 8 tokens": dict(
        attention="hybrid", attention_options=dict(tau_length_scaling=8)
    ),
    "mixed, prior on the dot-product heads": dict(attention="mixed", prior="alibi"),
    "hybrid with token shift (its state goes along)": dict(attention="hybrid", token_shift=True),
}


def small_model(**overrides) -> GPT:
    config = dict(vocab_size=40, seq_len=32, d_model=32, n_layers=2, n_heads=4) | overrides
    return GPT(GPTConfig(**config)).double().eval()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_sorted_decoding_with_a_window_over_the_whole_cache_is_full_attention(layout):
    model = small_model(**LAYOUTS[layout])
    prompt = torch.randint(40, (1, 12))
    _, _, full = model(prompt)
    _, _, sorted_ = model(prompt)
    sorted_ = sorted_caches(model, sorted_, SortedDecoding(window=64, buffer_size=4))  # merges, too
    token = prompt[:, -1:]
    for _ in range(10):
        expected, _, full = model(token, caches=full)
        logits, _, sorted_ = model(token, caches=sorted_)
        torch.testing.assert_close(logits, expected, rtol=0, atol=1e-10)
        token = expected[:, -1:].argmax(dim=-1)
    greedy = model.generate(prompt, 10, greedy=True)
    through_window = model.generate(
        prompt, 10, greedy=True, decoding="sorted", decoding_options=dict(window=64)
    )
    assert torch.equal(through_window, greedy)


def test_sorted_layer_output_is_within_what_the_mass_bound_allows():
    # Keys spread over a few units and a narrow tau: a window of 16 of 300 keys holds most, not all,
    # of the mass. Each head's output then misses at most 2 x bound x max|v| (docs/scalar_decoding.md),
    # so the layer's output at most |W_out|_inf times that.
    layer = ScalarMultiheadAttention(16, 4, value_groups=2, tau_init=0.01).double().eval()
    with torch.no_grad():
        layer.q_proj.weight.mul_(4)
        layer.k_proj.weight.mul_(4)
    x = torch.randn(1, 330, 16, dtype=torch.float64)
    _, full = layer(x[:, :300])
    cache = SortedLayerCache(layer, full, SortedDecoding(window=16, buffer_size=8))
    out_norm = layer.out_proj.weight.abs().sum(dim=1).max()
    misses = []
    with torch.no_grad():
        for t in range(300, 330):
            expected, full = layer(x[:, t : t + 1], cache=full)
            y, cache = layer(x[:, t : t + 1], cache=cache)
            max_v = full.v.abs().max()
            allowed = out_norm * 2 * cache.worst_outside_bound.max() * max_v
            assert (y - expected).abs().max() <= allowed + 1e-12
            misses.append((y - expected).abs().max())
    assert len(cache) == 330
    assert 0 < cache.worst_outside_bound.max() < 0.5  # the window cut mass, and the bound says so
    assert max(misses) > 1e-6


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(), "needs scalar heads, and this model has attention='standard'"),
        (dict(attention="scalar", prior="alibi"), "prior='alibi' adds a log-prior"),
        (dict(attention="scalar", window=8), "window=8 hides keys by position"),
    ],
)
def test_sorted_decoding_refuses_models_it_cannot_serve(overrides, message):
    model = small_model(**overrides)
    with pytest.raises(ValueError, match=message):
        model.generate(torch.randint(40, (1, 5)), 3, decoding="sorted", decoding_options=dict(window=8))


def test_sorted_decoding_refuses_bad_arguments():
    model = small_model(attention="scalar")
    with pytest.raises(ValueError, match="holds one sequence, got a batch of 2"):
        model.generate(torch.randint(40, (2, 5)), 3, decoding="sorted", decoding_options=SortedDecoding(8))
    prompt = torch.randint(40, (1, 5))
    with pytest.raises(ValueError, match=r"^decoding must be one of \('sorted',.*\), got 'sortd'$"):
        model.generate(prompt, 3, decoding="sortd")
    with pytest.raises(ValueError, match="must be a dict or a SortedDecoding, got int"):
        model.generate(prompt, 3, decoding="sorted", decoding_options=8)
    with pytest.raises(ValueError, match="decoding='sorted'.*missing 1 required .* 'window'"):
        model.generate(prompt, 3, decoding="sorted")
    with pytest.raises(ValueError, match="decoding_options are the options of a decoding: name it"):
        model.generate(prompt, 3, decoding_options=SortedDecoding(8))
    with pytest.raises(ValueError, match="SortedDecoding.window must be an int >= 1, got 0"):
        SortedDecoding(0)
    layer = model.blocks[0].attn
    _, kv = layer(torch.randn(1, 5, 32, dtype=torch.float64))
    cache = SortedLayerCache(layer, kv, SortedDecoding(8))
    with pytest.raises(ValueError, match="one unpadded sequence: pass no doc_ids"):
        layer(torch.randn(1, 1, 32, dtype=torch.float64), cache=cache, doc_ids=torch.zeros(1, 1))
    with pytest.raises(
        ValueError, match="holds 4 heads of one sequence, got a layer of 4 heads and a batch of 2"
    ):
        layer(torch.randn(2, 1, 32, dtype=torch.float64), cache=cache)
