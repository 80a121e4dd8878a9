"""The one registry: every kind's names in one place, and a name given as the wrong kind answered
with the kind it is."""

from __future__ import annotations

import pytest

import priorattn  # noqa: F401  (every kind registered)
import priorattn.studies.vision  # noqa: F401  (the grid positions)
from priorattn import registry
from priorattn.encodings import ENCODINGS
from priorattn.mechanisms import mechanism, mechanism_names
from priorattn.models.named import NAMED_MODELS
from priorattn.priors import names, registered


def test_every_kind_reads_its_names_from_the_registry():
    assert set(registry.names("prior")) == set(names())
    assert registry.names("attention") == mechanism_names()
    assert {"standard", "fox", "scalar", "hybrid", "mixed"} <= set(mechanism_names())
    assert registry.names("encoding") == tuple(ENCODINGS)
    assert set(NAMED_MODELS) <= set(registry.names("model"))
    assert registry.names("grid position") == ("goat", "rope", "alibi", "learned")  # the ViT's


def test_a_name_given_as_the_wrong_kind_says_what_it_is():
    with pytest.raises(ValueError, match="unknown prior 'fox'.*'fox' is an attention mechanism and a model"):
        registered("fox")
    with pytest.raises(ValueError, match="got 'ggd'; 'ggd' is a prior"):
        mechanism("ggd")
    with pytest.raises(
        ValueError, match="unknown encoding 'alibi': use one of none, rope.*'alibi' is a prior"
    ):
        registry.lookup("encoding", "alibi")
    with pytest.raises(ValueError, match=r"unknown prior 'xyz': use one of [^;]*$"):
        registered("xyz")


def test_a_taken_name_is_refused_and_a_kind_must_exist():
    registry.register("model", "nope", registry.entries("model")["nope"])  # the same entry again: no-op
    with pytest.raises(ValueError, match="a model named 'nope' is already registered"):
        registry.register("model", "nope", {"prior": "alibi"})
    with pytest.raises(ValueError, match="kind must be one of"):
        registry.names("position")
    with pytest.raises(TypeError):
        registry.entries("model")["new"] = {}  # a read-only view
