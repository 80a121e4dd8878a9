"""GPTConfig.attention: scalar, hybrid and mixed models decode from their caches like a full pass."""

from __future__ import annotations

import pytest
import torch

from priorattn.models import GPT, GPTConfig
from priorattn.scalar import MixedMultiheadAttention, ScalarMultiheadAttention, ScalarOptions

BASE = dict(vocab_size=64, seq_len=32, d_model=32, n_layers=2, n_heads=4)
KINDS = {
    "scalar": dict(attention="scalar", attention_options=dict(groups=2, sink=True)),
    "hybrid": dict(attention="hybrid", encoding="rope", prior="goat", attention_options=dict(tau="token")),
    "mixed": dict(attention="mixed", prior="alibi", attention_options=ScalarOptions(heads=3, tau="global")),
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
    for name in ("attention", "attention_options"):
        del saved[name]
    assert GPTConfig.from_dict(saved) == GPTConfig(**BASE)
    assert GPTConfig.from_dict(saved).attention == "standard"


def test_the_options_are_saved_nested_and_load_as_given():
    config = GPTConfig(**BASE, **KINDS["mixed"])
    saved = config.to_dict()
    assert saved["attention_options"]["heads"] == 3 and saved["attention_options"]["tau"] == "global"
    assert GPTConfig.from_dict(saved) == config
    assert GPTConfig(**BASE, attention="mixed").attention_options.heads == 2  # half of n_heads


def test_a_config_saved_with_flattened_scalar_fields_loads_into_the_options():
    flattened = dict(BASE, attention="mixed", prior="alibi", scalar_heads=3, scalar_tau="global")
    flattened |= dict(scalar_groups=None, scalar_tau_init=0.1, scalar_tau_cap=None, scalar_sink=False)
    assert GPTConfig.from_dict(flattened) == GPTConfig(**BASE, **KINDS["mixed"])
    standard = dict(BASE, scalar_heads=None, scalar_tau="head", scalar_sink=False)  # every field saved
    assert GPTConfig.from_dict(standard) == GPTConfig(**BASE)
    with pytest.raises(
        ValueError,
        match=r"scalar_sink=True, an option of attention='scalar' or .*"
        r"but its attention is 'standard': it cannot be represented",
    ):
        GPTConfig.from_dict(dict(BASE, scalar_sink=True))


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(attention="sorted"), "attention must be one of"),
        (
            dict(attention_options=dict(sink=True)),
            r"^attention='standard' has no option 'sink': it takes none; 'sink' is an option of "
            r"'scalar', 'hybrid', 'mixed'$",
        ),
        (dict(attention_options=ScalarOptions(groups=2)), "attention='standard' takes no options"),
        (dict(attention="scalar", attention_options=dict(sinks=True)), "its options are heads, groups, tau"),
        (dict(attention="scalar", encoding="rope"), "has none"),
        (dict(attention="mixed", attention_options=dict(heads=4)), r"heads must be in \[1, n_heads - 1\]"),
        (dict(attention="hybrid", attention_options=dict(heads=2)), "heads is for attention='mixed'"),
        (
            dict(attention="scalar", attention_options=dict(groups=3)),
            "groups must be a positive int dividing 4",
        ),
        (dict(attention="scalar", n_kv_heads=2), "groups values with the option groups"),
        (dict(attention="scalar", attention_options=dict(sink=True), prior="goat"), "sink has no position"),
        (
            dict(attention="scalar", attention_options=dict(tau_init=-1.0)),
            "tau_init must be a finite number > 0.0001",
        ),
        (dict(attention="scalar", attention_options=dict(tau="layer")), "tau must be one of"),
        (
            dict(attention="scalar", attention_options=dict(tau_length_scaling=True)),
            "tau_length_scaling must be None or",
        ),
        (
            dict(attention="scalar", attention_options=[1]),
            "attention_options must be a dict or None, got list",
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
