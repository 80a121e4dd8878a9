"""Sparse attention maps in the layer and the model: decoding through the cache, training, runs."""

from __future__ import annotations

import math

import pytest
import torch

from priorattn import PriorMultiheadAttention
from priorattn.eot import regularizer
from priorattn.models import GPTConfig
from priorattn.priors import GOAT
from priorattn.train import TrainConfig, load_run, train


def test_layer_decodes_through_the_cache_as_one_full_pass():
    layer = PriorMultiheadAttention(32, 4, prior=GOAT(4, 1), normalizer="entmax15").double()
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    full, _ = layer(x)
    first, cache = layer(x[:, :5])
    steps = [first]
    for t in range(5, 9):
        y, cache = layer(x[:, t : t + 1], cache=cache)
        steps.append(y)
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


def test_layer_weights_are_the_map_of_its_logits():
    """The layer's output is its values weighted by sparsemax of the layer's own logits."""
    layer = PriorMultiheadAttention(16, 2, normalizer="sparsemax").double()
    x = torch.randn(1, 6, 16, dtype=torch.float64)
    q = layer.q_proj(x).view(1, 6, 2, 8).transpose(1, 2)
    k = layer.k_proj(x).view(1, 6, 2, 8).transpose(1, 2)
    v = layer.v_proj(x).view(1, 6, 2, 8).transpose(1, 2)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    p = regularizer("sparsemax").normalize(q @ k.transpose(-1, -2) / 8**0.5, causal)
    expected = layer.out_proj((p @ v).transpose(1, 2).reshape(1, 6, 16))
    torch.testing.assert_close(layer(x)[0], expected)
    assert (p == 0).sum() > (~causal).sum() * 2  # sparse beyond the causal mask


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(normalizer=0.5), "entmax alpha must be a finite number > 1"),
        (dict(normalizer="sparsemax", backend="memeff"), "backend='memeff' computes softmax only"),
    ],
)
def test_bad_normalizers_are_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PriorMultiheadAttention(16, 2, **kwargs)
    with pytest.raises(ValueError, match=message):
        GPTConfig(vocab_size=256, seq_len=8, d_model=16, n_layers=1, n_heads=2, **kwargs)


def test_a_sparsemax_model_with_a_prior_trains_and_reloads(corpus_dir, tmp_path):
    config = GPTConfig(
        vocab_size=256,
        seq_len=32,
        d_model=32,
        n_layers=2,
        n_heads=2,
        prior="goat(num_freqs=2)",
        normalizer="sparsemax",
    )
    options = TrainConfig(
        data=str(corpus_dir), steps=30, batch_size=4, eval_sequences=2, lr=1e-2, warmup_steps=3
    )
    result = train(config, options, tmp_path / "run", progress=False)
    run = load_run(tmp_path / "run")
    assert run.model_config.normalizer == "sparsemax"
    assert all(block.attn.normalizer == "sparsemax" for block in run.model.blocks)
    assert result.val_loss < math.log(256) - 1.0  # an untrained model is near log 256 nats per byte
