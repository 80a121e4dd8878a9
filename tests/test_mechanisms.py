"""The mechanism registry: a mechanism registered here, and nowhere else, builds into a GPT, decodes
from its caches and trains through ``priorattn.train``; unknown names and bad registrations are named."""

from __future__ import annotations

import json
import math

import pytest
import torch
from factories import word_salad
from torch import nn

from priorattn.layers import PriorMultiheadAttention, standard_attention
from priorattn.mechanisms import (
    decoding_path,
    mechanism,
    mechanism_names,
    register_config_check,
    register_decoding,
    register_mechanism,
)
from priorattn.models import GPT, GPTConfig
from priorattn.scalar import SortedDecoding
from priorattn.train import TrainConfig, load_run, train


class GatedAttention(nn.Module):
    """The standard layer's output times a learned gate that starts at 1."""

    def __init__(self, config, prior):
        super().__init__()
        self.inner = standard_attention(config, prior)
        self.gate = nn.Parameter(torch.ones(()))

    @property
    def prior(self):
        return self.inner.prior

    def forward(self, x, *, cache=None, **masks):
        y, cache = self.inner(x, cache=cache, **masks)
        return self.gate * y, cache


register_mechanism("gated", GatedAttention)

BASE = dict(vocab_size=256, seq_len=32, d_model=32, n_layers=2, n_heads=2, prior="alibi")


def test_a_registered_mechanism_builds_each_block_with_the_gpts_init():
    torch.manual_seed(0)
    standard = GPT(GPTConfig(**BASE))
    torch.manual_seed(0)
    gated = GPT(GPTConfig(**BASE, attention="gated"))
    assert all(isinstance(block.attn, GatedAttention) for block in gated.blocks)
    assert isinstance(gated.blocks[0].attn.inner, PriorMultiheadAttention)
    renamed = {name.replace(".attn.inner.", ".attn."): p for name, p in gated.named_parameters()}
    assert set(renamed) - dict(standard.named_parameters()).keys() == {
        "blocks.0.attn.gate",
        "blocks.1.attn.gate",
    }
    for name, p in standard.named_parameters():  # the same draws, in the same order
        assert torch.equal(renamed[name], p), name
    tokens = torch.randint(0, 256, (2, 12))
    torch.testing.assert_close(gated(tokens)[0], standard(tokens)[0], rtol=0, atol=0)
    generated = gated.generate(tokens[:, :5], 6, greedy=True)  # through its caches
    assert torch.equal(generated, standard.generate(tokens[:, :5], 6, greedy=True))


def test_a_registered_mechanism_trains_saves_and_reloads(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIORATTN_CACHE", str(tmp_path / "cache"))
    (tmp_path / "corpus").mkdir()
    corpus = word_salad(tmp_path / "corpus", "the quick brown fox jumps over the lazy dog", docs=4)
    config = TrainConfig(data=str(corpus), steps=3, batch_size=4, eval_sequences=2, log_every=1)
    result = train(GPTConfig(**BASE, attention="gated"), config, tmp_path / "run", progress=False)
    assert result.step == 3 and math.isfinite(result.train_loss)
    assert json.loads((tmp_path / "run" / "config.json").read_text())["model"]["attention"] == "gated"
    model = load_run(tmp_path / "run").model
    assert [block.attn.gate.item() != 1.0 for block in model.blocks] == [True, True]  # it learned


def test_an_unknown_mechanism_is_named_with_the_registered_ones():
    names = mechanism_names()
    assert names[:5] == ("standard", "fox", "scalar", "hybrid", "mixed") and "gated" in names
    with pytest.raises(
        ValueError, match=r"^attention must be one of \('standard', .*'gated'.*\), got 'sorted'$"
    ):
        GPTConfig(**BASE, attention="sorted")
    with pytest.raises(ValueError, match="attention must be one of"):
        mechanism(["standard"])
    assert mechanism("gated").prior_heads(GPTConfig(**BASE)) == 2


def test_other_packages_refuse_their_options_and_paths_for_a_registered_mechanism():
    with pytest.raises(ValueError, match="scalar_sink configures scalar heads"):
        GPTConfig(**BASE, attention="gated", scalar_sink=True)
    model = GPT(GPTConfig(**BASE, attention="gated"))
    with pytest.raises(ValueError, match="needs scalar heads, and this model has attention='gated'"):
        model.generate(torch.randint(0, 256, (1, 4)), 2, sorted_decoding=SortedDecoding(8))
    with pytest.raises(ValueError, match="the scalar regularizers .* need scalar heads"):
        model.aux_losses(dict(tau=0.1))
    aux = model.aux_losses(TrainConfig().regularization())  # no weight: nothing to add
    aux.start(0)
    model(torch.randint(0, 256, (1, 4)))
    assert aux.losses() == {} and aux.logged() == {}


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: register_mechanism("gated", GatedAttention), ValueError, "'gated' is already registered"),
        (lambda: register_mechanism("", GatedAttention), ValueError, "name must be a non-empty str"),
        (lambda: register_mechanism("x", None), TypeError, "build must be callable, got NoneType"),
        (lambda: register_mechanism("x", GatedAttention, prior_heads=2), TypeError, "prior_heads must be"),
        (lambda: register_config_check("scalar"), TypeError, "check must be callable, got str"),
        (lambda: register_decoding(SortedDecoding(8), len), TypeError, "kind must be a class"),
        (lambda: decoding_path("option", 8), TypeError, "option must be a SortedDecoding, got int"),
    ],
)
def test_bad_registrations_are_named(call, error, message):
    with pytest.raises(error, match=message):
        call()
    assert "x" not in mechanism_names()
