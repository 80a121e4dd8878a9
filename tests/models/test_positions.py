"""The positional mechanisms of the studies: the fixed positions and every registered prior."""

from __future__ import annotations

import pytest

from priorattn.layers import ForgetGate
from priorattn.models import GPT, GPTConfig
from priorattn.models.positions import (
    POSITION_STYLES,
    POSITIONS,
    mechanism_fields,
    mechanism_label,
    mechanism_of_spec,
    mechanism_style,
    mechanisms,
    not_a_prior,
    positions,
    split_mechanism,
)
from priorattn.priors import names


def test_the_positions_are_the_studies_and_every_registered_prior():
    table = positions()
    assert list(table)[: len(POSITIONS)] == list(POSITIONS)  # the studies' order first
    assert set(names()) <= set(table)
    assert table["ggd"] == ("GGD", dict(prior="ggd"))  # a registered prior: its class names it
    assert table["bam"] == ("BAM", dict(prior="ggd"))  # the studies' name for it stays
    assert mechanism_fields("ggd+ssmax") == dict(prior="ggd", ssmax=True)
    assert mechanism_label("ggd+ssmax") == "GGD + SSMax"
    assert {"ggd", "ggd+ssmax", "bam+ssmax"} <= set(mechanisms())


def test_a_mechanism_outside_the_table_given_is_refused():
    with pytest.raises(ValueError, match="unknown mechanism 'xpos': use one of nope, rope, alibi"):
        split_mechanism("xpos")
    with pytest.raises(ValueError, match="unknown mechanism 'ggd': use one of nope, each optionally with"):
        split_mechanism("ggd", dict(nope=POSITIONS["nope"]))


def test_distinct_mechanisms_are_drawn_in_distinct_colour_and_line_style_pairs():
    extensions = ["rope_pi", "rope_ntk", "rope_yarn"]  # the retrieval study's (study.EXTENSIONS)
    drawn = [*mechanisms(), *extensions, *(e + "+ssmax" for e in extensions), "learned", "learned+ssmax"]
    pairs = [(mechanism_style(m)["color"], str(mechanism_style(m)["linestyle"])) for m in drawn]
    assert len(set(pairs)) == len(drawn)
    assert set(POSITIONS) <= set(POSITION_STYLES)  # every position of the studies is chosen, not cycled
    compared = ["nope", "sinusoidal", "rope", "local_rope", "alibi", "bam", "goat"]  # compare's models
    for key in ("color", "marker"):
        assert len({mechanism_style(m)[key] for m in compared}) == len(compared)
    assert mechanism_style("bam+ssmax") == mechanism_style("bam") | dict(linestyle="--")
    assert mechanism_style("rope_pi")["color"] == mechanism_style("rope")["color"]
    with pytest.raises(ValueError, match="unknown mechanism 'xpos'"):
        mechanism_style("xpos")


def test_fox_is_a_position_whose_model_has_a_forget_gate_in_every_block():
    assert mechanism_fields("fox") == dict(attention="fox")
    assert mechanism_fields("fox+ssmax") == dict(attention="fox", ssmax=True)
    assert mechanism_label("fox+ssmax") == "FoX + SSMax" and {"fox", "fox+ssmax"} <= set(mechanisms())
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
