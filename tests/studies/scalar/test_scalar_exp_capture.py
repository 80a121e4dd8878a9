"""Capturing a GPT's scalar layers: the weights are the seed's softmax, the outputs the layer's own."""

from __future__ import annotations

import pytest
import torch

from priorattn.models import GPT, GPTConfig
from priorattn.studies.scalar.capture import capture_scalar_layers, nearest_mass


def tiny_gpt(attention: str, encoding: str = "none", **options) -> GPT:
    """A 2-layer GPT of ``attention`` with its ``options``, with random non-trivial scalar
    parameters (the sink starts at zero)."""
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=32,
        seq_len=16,
        d_model=32,
        n_layers=2,
        n_heads=4,
        attention=attention,
        attention_options=options,
    )
    model = GPT(config).double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "sink_value" in name or "temperature" in name:
                p.add_(0.5 * torch.randn_like(p))
            elif "q_proj" in name or "k_proj" in name:
                p.mul_(40.0)  # scalar queries and keys of order 1, so the kernel is not flat
    return model.eval()


@pytest.mark.parametrize(
    "attention, options",
    [
        ("scalar", dict(groups=2, tau="token", sink=True)),
        ("hybrid", dict(encoding="rope")),
        ("mixed", dict(heads=2, sink=True)),
    ],
)
def test_captured_weights_reproduce_each_layers_output(attention, options):
    model = tiny_gpt(attention, **options)
    tokens = torch.randint(0, 32, (2, 12))
    captures = capture_scalar_layers(model, tokens)
    assert len(captures) == 2
    outputs = {}
    hooks = [
        c.layer.register_forward_hook(lambda m, a, out, i=i: outputs.__setitem__(i, out[0]))
        for i, c in enumerate(captures)
    ]
    model(tokens)
    for h in hooks:
        h.remove()
    for i, c in enumerate(captures):
        weights, sink = c.weights()
        mass = weights.sum(-1) + (0 if sink is None else sink)
        torch.testing.assert_close(mass, torch.ones_like(mass))
        heads = c.output(weights, sink)  # (B, H, L, D)
        B, H, L, D = heads.shape
        expected = c.layer.out_proj(heads.transpose(1, 2).reshape(B, L, H * D))
        torch.testing.assert_close(expected, outputs[i])


def test_pure_scalar_weights_are_a_softmax_of_the_negative_squared_distance_over_tau():
    model = tiny_gpt("scalar")
    tokens = torch.randint(0, 32, (1, 9))
    for c in capture_scalar_layers(model, tokens):
        weights, sink = c.weights(torch.tensor([3, 8]))
        assert sink is None
        for r, i in enumerate((3, 8)):
            for h in range(4):
                d = c.q_s[0, h, i] - c.k_s[0, h, : i + 1]
                expected = torch.softmax(-(d**2) / c.tau[0, h, i], dim=0)
                torch.testing.assert_close(weights[0, h, r, : i + 1], expected)
                assert (weights[0, h, r, i + 1 :] == 0).all()


def test_sink_weight_is_the_sink_column_of_the_dense_softmax():
    model = tiny_gpt("scalar", sink=True)
    tokens = torch.randint(0, 32, (1, 6))
    c = capture_scalar_layers(model, tokens)[1]
    _, sink = c.weights()
    i, h = 5, 2
    logits = torch.cat(
        [-((c.q_s[0, h, i] - c.layer.sink_key).view(1) ** 2), -((c.q_s[0, h, i] - c.k_s[0, h]) ** 2)]
    )
    torch.testing.assert_close(sink[0, h, i], torch.softmax(logits / c.tau[0, h, i], dim=0)[0])


def test_distances_are_infinite_for_keys_a_query_does_not_see():
    c = capture_scalar_layers(tiny_gpt("scalar"), torch.randint(0, 32, (1, 5)))[0]
    d = c.distances()
    future = torch.ones(5, 5, dtype=torch.bool).triu(1)
    assert torch.isinf(d[0, 0][future]).all() and torch.isfinite(d[0, 0][~future]).all()
    torch.testing.assert_close(d[0, 1, 4, 2], (c.q_s[0, 1, 4] - c.k_s[0, 1, 2]).abs())


def test_nearest_mass_sums_the_weights_of_the_k_nearest_keys():
    weights = torch.tensor([[0.1, 0.2, 0.3, 0.4]])
    distances = torch.tensor([[3.0, 0.5, 1.0, torch.inf]])
    assert nearest_mass(weights, distances, 1).item() == pytest.approx(0.2)
    assert nearest_mass(weights, distances, 2).item() == pytest.approx(0.5)
    assert nearest_mass(weights, distances, 9).item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="k must be an int >= 1"):
        nearest_mass(weights, distances, 0)


def test_a_model_without_scalar_heads_is_refused():
    model = GPT(GPTConfig(vocab_size=32, seq_len=16, d_model=32, n_layers=1, n_heads=4))
    with pytest.raises(ValueError, match="no scalar heads"):
        capture_scalar_layers(model, torch.zeros(1, 4, dtype=torch.long))
