"""The mechanism registry: a mechanism registered here, and nowhere else, builds into a GPT, decodes
from its caches and trains through ``priorattn.train``; its options, declared here and nowhere
else, are saved with the model's config and are flags of ``priorattn train``; unknown names and bad
registrations are named."""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass

import pytest
import torch
from factories import word_salad
from torch import nn

from priorattn import cli
from priorattn.cli import train as train_command
from priorattn.layers import PriorMultiheadAttention, standard_attention
from priorattn.mechanisms import (
    decoding,
    mechanism,
    mechanism_names,
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


@dataclass(frozen=True)
class ScaledOptions:
    """The options of the ``"scaled"`` mechanism.

    - ``output_scale``: the fixed factor of the standard layer's output.
    """

    output_scale: float = 1.0


class ScaledAttention(nn.Module):
    """The standard layer's output times ``output_scale``, an option of its own."""

    def __init__(self, config, prior):
        super().__init__()
        self.inner = standard_attention(config, prior)
        self.output_scale = config.attention_options.output_scale

    @property
    def prior(self):
        return self.inner.prior

    def forward(self, x, *, cache=None, **masks):
        y, cache = self.inner(x, cache=cache, **masks)
        return self.output_scale * y, cache


def check_scaled(config):
    if not config.attention_options.output_scale > 0:
        raise ValueError(f"output_scale must be > 0, got {config.attention_options.output_scale!r}")


register_mechanism("scaled", ScaledAttention, options=ScaledOptions, check=check_scaled)

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
    with pytest.raises(ValueError, match="attention='gated' has no option 'sink': it takes none"):
        GPTConfig(**BASE, attention="gated", attention_options=dict(sink=True))
    model = GPT(GPTConfig(**BASE, attention="gated"))
    with pytest.raises(ValueError, match="needs scalar heads, and this model has attention='gated'"):
        model.generate(torch.randint(0, 256, (1, 4)), 2, decoding="sorted", decoding_options=dict(window=8))
    aux = model.aux_losses()  # no scalar heads, no options: nothing to add
    aux.start(0)
    model(torch.randint(0, 256, (1, 4)))
    assert aux.losses() == {} and aux.logged() == {}


def test_a_mechanisms_own_options_build_save_and_load_with_no_config_field():
    config = GPTConfig(**BASE, attention="scaled", attention_options=dict(output_scale=0.5))
    assert config.attention_options == ScaledOptions(0.5)
    assert "output_scale" not in {f for f in GPTConfig.__dataclass_fields__}
    assert "output_scale" not in {f for f in TrainConfig.__dataclass_fields__}
    saved = json.loads(json.dumps(config.to_dict()))
    assert saved["attention_options"] == {"output_scale": 0.5}
    assert GPTConfig.from_dict(saved) == config
    assert GPTConfig(**BASE, attention="scaled").attention_options == ScaledOptions()
    torch.manual_seed(0)
    standard = GPT(GPTConfig(**BASE))
    torch.manual_seed(0)
    scaled = GPT(config)
    tokens = torch.randint(0, 256, (2, 6))
    hidden = {}
    for name, model in (("standard", standard), ("scaled", scaled)):
        handle = model.blocks[0].attn.register_forward_hook(
            lambda m, i, o, n=name: hidden.setdefault(n, o[0])
        )
        model(tokens)
        handle.remove()
    torch.testing.assert_close(hidden["scaled"], 0.5 * hidden["standard"])
    with pytest.raises(ValueError, match="output_scale must be > 0, got 0.0"):
        GPTConfig(**BASE, attention="scaled", attention_options=dict(output_scale=0.0))
    with pytest.raises(
        ValueError,
        match=r"^attention='scaled' has no option 'scale': its options are output_scale$",
    ):
        GPTConfig(**BASE, attention="scaled", attention_options=dict(scale=2.0))


def test_a_mechanisms_own_options_are_flags_of_train(capsys):
    args = cli.build_parser().parse_args(
        ["train", "--out", "run", "--attention", "scaled", "--output-scale", "2"]
    )
    model, _ = train_command.train_configs(args)
    assert (model.attention, model.attention_options) == ("scaled", ScaledOptions(2.0))
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "attention options (scaled): --output-scale OUTPUT_SCALE" in shown
    assert "the fixed factor of the standard layer's output. (1.0)" in shown


def test_decodings_are_chosen_by_name():
    entry, options = decoding("sorted", dict(window=8))
    assert options == SortedDecoding(8) and entry.options is SortedDecoding
    assert decoding("sorted", SortedDecoding(4))[1] == SortedDecoding(4)


@dataclass
class Mutable:
    """Options that are not frozen."""

    scale: float = 1.0


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: register_mechanism("gated", GatedAttention), ValueError, "'gated' is already registered"),
        (lambda: register_mechanism("", GatedAttention), ValueError, "name must be a non-empty str"),
        (lambda: register_mechanism("x", None), TypeError, "build must be callable, got NoneType"),
        (lambda: register_mechanism("x", GatedAttention, prior_heads=2), TypeError, "prior_heads must be"),
        (
            lambda: register_mechanism("x", GatedAttention, check="scalar"),
            TypeError,
            "check must be callable",
        ),
        (
            lambda: register_mechanism("x", GatedAttention, options=dict),
            TypeError,
            "options must be a dataclass",
        ),
        (
            lambda: register_mechanism("x", GatedAttention, options=argparse.Namespace),
            TypeError,
            "a dataclass",
        ),
        (
            lambda: register_mechanism("x", GatedAttention, options=Mutable),
            TypeError,
            "must be a frozen dataclass",
        ),
        (lambda: register_decoding("x", SortedDecoding(8), len), TypeError, "options must be a class"),
        (lambda: register_decoding("sorted", dict, len), ValueError, "'sorted' is already registered"),
        (lambda: decoding("sortd"), ValueError, r"decoding must be one of \('sorted',"),
    ],
)
def test_bad_registrations_are_named(call, error, message):
    with pytest.raises(error, match=message):
        call()
    assert "x" not in mechanism_names()
