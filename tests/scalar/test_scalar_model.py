"""GPTConfig.attention: scalar, hybrid and mixed models decode from their caches like a full pass."""

from __future__ import annotations

import pytest
import torch

from priorattn.models import GPT, GPTConfig
from priorattn.scalar import MixedMultiheadAttention, ScalarMultiheadAttention

BASE = dict(vocab_size=64, seq_len=32, d_model=32, n_layers=2, n_heads=4)
KINDS = {
    "scalar": dict(attention="scalar", scalar_groups=2, scalar_sink=True),
    "hybrid": dict(attention="hybrid", encoding="rope", prior="goat", scalar_tau="token"),
    "mixed": dict(attention="mixed", scalar_heads=3, prior="alibi", scalar_tau="global"),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_cached_generation_steps_equal_the_full_pass(kind):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**BASE, **KINDS[kind])).eval()
    tokens = torch.randint(0, 64, (2, 12))
    full, _, _ = model(tokens)
    logits, _, caches = model(tokens[:, :7])
    steps = [logits]
    for t in range(7, 12):
        logits, _, caches = model(tokens[:, t : t + 1], caches=caches)
        steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-4, rtol=1e-4)


def test_attention_field_builds_its_layers():
    layers = {kind: GPT(GPTConfig(**BASE, **KINDS[kind])).blocks[0].attn for kind in KINDS}
    assert isinstance(layers["scalar"], ScalarMultiheadAttention) and not layers["scalar"].content_dim
    assert layers["scalar"].value_groups == 2 and layers["scalar"].sink_value is not None
    assert isinstance(layers["hybrid"], ScalarMultiheadAttention) and layers["hybrid"].content_dim == 8
    mixed = layers["mixed"]
    assert isinstance(mixed, MixedMultiheadAttention)
    assert (mixed.dot.num_heads, mixed.scalar.num_heads, mixed.dot.prior.num_heads) == (1, 3, 1)


def test_a_config_saved_before_the_field_loads_as_standard():
    saved = GPTConfig(**BASE).to_dict()
    for name in [name for name in saved if name == "attention" or name.startswith("scalar_")]:
        del saved[name]
    assert GPTConfig.from_dict(saved) == GPTConfig(**BASE)
    assert GPTConfig.from_dict(saved).attention == "standard"


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(attention="sorted"), "attention must be one of"),
        (dict(scalar_sink=True), "scalar_sink configures scalar heads"),
        (dict(scalar_groups=2), "scalar_groups configures scalar heads"),
        (dict(attention="scalar", encoding="rope"), "has none"),
        (dict(attention="mixed", scalar_heads=4), r"scalar_heads must be in \[1, n_heads - 1\]"),
        (dict(attention="hybrid", scalar_heads=2), "scalar_heads is for attention='mixed'"),
        (dict(attention="scalar", scalar_groups=3), "scalar_groups must be a positive int dividing 4"),
        (dict(attention="scalar", n_kv_heads=2), "groups values with scalar_groups"),
        (dict(attention="scalar", scalar_sink=True, prior="goat"), "scalar_sink has no position"),
        (dict(attention="scalar", scalar_tau_init=-1.0), "scalar_tau_init must be a finite number > 0.0001"),
        (dict(attention="scalar", scalar_tau="layer"), "scalar_tau must be one of"),
        (dict(scalar_tau_length_scaling=8), "scalar_tau_length_scaling configures scalar heads"),
        (
            dict(attention="scalar", scalar_tau_length_scaling=True),
            "scalar_tau_length_scaling must be None or",
        ),
    ],
)
def test_bad_attention_config_is_named(options, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(**BASE, **options)


def test_a_normalizer_other_than_softmax_is_refused_with_scalar_heads():
    from priorattn.models import GPTConfig

    with pytest.raises(ValueError, match="normalizer='sparsemax' replaces the softmax of dot-product heads"):
        GPTConfig(
            vocab_size=256,
            seq_len=32,
            d_model=32,
            n_layers=1,
            n_heads=2,
            attention="hybrid",
            normalizer="sparsemax",
        )
