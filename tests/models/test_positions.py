"""The positional mechanisms of the studies: the fixed positions and every registered prior."""

from __future__ import annotations

import pytest

from priorattn.layers import ForgetGate
from priorattn.models import GPT, GPTConfig
from priorattn.models.positions import (
    POSITIONS,
    mechanism_fields,
    mechanism_label,
    mechanisms,
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


def test_fox_is_a_position_whose_model_has_a_forget_gate_in_every_block():
    assert mechanism_fields("fox") == dict(attention="fox")
    assert mechanism_fields("fox+ssmax") == dict(attention="fox", ssmax=True)
    assert mechanism_label("fox+ssmax") == "FoX + SSMax" and {"fox", "fox+ssmax"} <= set(mechanisms())
    config = GPTConfig(vocab_size=16, seq_len=8, d_model=16, n_layers=2, n_heads=2, **mechanism_fields("fox"))
    assert (config.prior, config.encoding) == ("uniform", "none")  # the paper's FoX: no positional encoding
    assert all(isinstance(block.attn.forget_gate, ForgetGate) for block in GPT(config).blocks)
