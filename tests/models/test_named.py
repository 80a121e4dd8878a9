"""The named models (the ``"model"`` kind of the registry) and the positions of the studies: the
named models and every registered prior."""

from __future__ import annotations

import pytest

from priorattn.layers import ForgetGate
from priorattn.models import GPT, GPTConfig
from priorattn.models.named import (
    NAMED_MODELS,
    mechanism_fields,
    mechanism_of_spec,
    mechanisms,
    not_a_prior,
    positions,
    prior_of_model,
    split_mechanism,
)
from priorattn.priors import names


def test_the_positions_are_the_studies_and_every_registered_prior():
    table = positions()
    assert list(table)[: len(NAMED_MODELS)] == list(NAMED_MODELS)  # the named models' order first
    assert set(names()) <= set(table)
    assert table["ggd"] == dict(prior="ggd")  # a registered prior
    assert table["bam"] == dict(prior="ggd")  # the studies' name for it stays
    assert mechanism_fields("ggd+ssmax") == dict(prior="ggd", ssmax=True)
    assert {"ggd", "ggd+ssmax", "bam+ssmax"} <= set(mechanisms())


def test_a_mechanism_outside_the_table_given_is_refused():
    with pytest.raises(ValueError, match="unknown mechanism 'xpos': use one of nope, rope, alibi"):
        split_mechanism("xpos")
    with pytest.raises(ValueError, match="unknown mechanism 'ggd': use one of nope, each optionally with"):
        split_mechanism("ggd", ["nope"])


def test_fox_is_a_position_whose_model_has_a_forget_gate_in_every_block():
    assert mechanism_fields("fox") == dict(attention="fox")
    assert mechanism_fields("fox+ssmax") == dict(attention="fox", ssmax=True)
    assert {"fox", "fox+ssmax"} <= set(mechanisms())
    config = GPTConfig(vocab_size=16, seq_len=8, d_model=16, n_layers=2, n_heads=2, **mechanism_fields("fox"))
    assert (config.prior, config.encoding) == ("uniform", "none")  # the paper's FoX: no positional encoding
    assert all(isinstance(block.attn.forget_gate, ForgetGate) for block in GPT(config).blocks)


@pytest.mark.parametrize(
    "spec, mechanism",
    [
        ("goat(slope=none)", "goat_noslope"),
        ("goat(slope=none, sink=none)", "goat_spectral"),
        ("goat(sink=none, slope=none)+ssmax", "goat_spectral+ssmax"),
        ("goat(num_freqs=3)", None),
        ("not a spec((", None),
    ],
)
def test_a_prior_spec_names_the_mechanism_that_is_that_prior(spec, mechanism):
    assert mechanism_of_spec(spec) == mechanism


@pytest.mark.parametrize("name, fields", [("fox", {"attention": "fox"}), ("rope", {"encoding": "rope"})])
def test_a_mechanism_that_is_no_prior_gives_its_fields(name, fields):
    assert not_a_prior(name) == fields
    assert not_a_prior("goat") is None and not_a_prior("goat_noslope") is None and not_a_prior("xyz") is None


@pytest.mark.parametrize(
    "name, prior",
    [
        ("bam", "ggd"),
        ("nope", "uniform"),
        ("goat_noslope", "goat(slope=none)"),
        ("rope", None),
        ("fox", None),
    ],
)
def test_a_named_model_that_is_a_prior_alone_is_that_prior_in_a_config(name, prior):
    assert prior_of_model(name) == prior
    sizes = dict(vocab_size=16, seq_len=8, d_model=16, n_layers=1, n_heads=2)
    if prior is None:
        with pytest.raises(ValueError, match=f"unknown prior '{name}'.*'{name}' is an? .*model"):
            GPTConfig(**sizes, prior=name)
    else:
        assert GPTConfig(**sizes, prior=name).prior == GPTConfig(**sizes, prior=prior).prior
