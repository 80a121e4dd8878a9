"""The positional mechanisms of the studies: the fixed positions and every registered prior."""

from __future__ import annotations

import pytest

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
