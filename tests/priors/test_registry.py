"""The prior registry: what registering declares, and every registered prior describing itself."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch import nn

from priorattn.priors import (
    GGD,
    GOAT,
    ALiBi,
    Choice,
    FromModel,
    Prior,
    Sum,
    Uniform,
    build_prior,
    names,
    options,
    register,
)
from priorattn.priors.registry import UnregisteredPrior

BUILT_IN = {
    "uniform": lambda: Uniform(),
    "alibi": lambda: ALiBi(4),
    "ggd": lambda: GGD(4, init="alibi", trainable=["alpha", "mu"], eps=1e-3),
    "goat": lambda: GOAT(4, 3, slope=False, init="alibi", freq_base=500, train_len=64, sink_hidden=5),
    "sum": lambda: Sum(ALiBi(4), GOAT(4, 2, sink=False)),
    "nested sum": lambda: Sum(GGD(4), Sum(ALiBi(4), GOAT(4, 1))),
}


def test_the_library_registers_its_priors():
    assert {"uniform", "alibi", "ggd", "goat"} <= set(names())
    assert names() == tuple(sorted(names()))


def test_an_options_type_and_default_are_its_constructor_arguments():
    goat = options("goat")
    assert list(goat)[:3] == ["num_freqs", "sink", "slope"]  # the constructor's order
    assert (goat["num_freqs"].kind, goat["num_freqs"].default) == (int, 8)
    assert (goat["freq_base"].kind, goat["freq_base"].default) == (float, 10_000.0)
    assert goat["train_len"].from_model.key == "train_len"
    assert goat["init"].from_model.values == {"uniform": "uniform", "alibi": "alibi"}
    assert (options("ggd")["trainable"].kind, options("ggd")["trainable"].default) == (
        tuple[str, ...],
        ("alpha", "beta"),
    )
    assert options("alibi") == {} and options("uniform") == {}
    assert all(option.doc for name in names() for option in options(name).values())


@pytest.mark.parametrize("name", list(BUILT_IN))
def test_every_prior_describes_itself_and_is_built_again_the_same(name):
    prior = BUILT_IN[name]()
    spec = prior.spec()
    assert json.loads(json.dumps(spec)) == spec  # plain data
    torch.manual_seed(0)
    again = build_prior(spec, 4)
    assert again.spec() == spec and type(again) is type(prior)
    assert again.state_dict().keys() == prior.state_dict().keys()
    assert all(a.requires_grad == b.requires_grad for a, b in zip(again.parameters(), prior.parameters()))
    again.load_state_dict(prior.state_dict())
    positions = torch.arange(-3, 9)
    torch.testing.assert_close(again.log_prior(positions, positions), prior.log_prior(positions, positions))


def test_a_spec_names_every_option_as_it_was_given():
    assert GOAT(4, 3, slope="none", init="alibi", freq_base=500, train_len=64).spec() == dict(
        name="goat",
        num_freqs=3,
        sink="shared",
        slope="none",
        gate=False,
        init="alibi",
        learnable_freqs=False,
        freq_base=500.0,
        train_len=64,
        sink_freqs=8,
        sink_hidden=16,
        max_slope=1.0,
    )
    assert GGD(2, trainable=("mu",)).spec() == dict(name="ggd", init="uniform", trainable=["mu"], eps=1e-5)
    assert ALiBi(2, slopes=torch.tensor([0.5, 0.25])).spec() == dict(name="alibi")  # slopes: a buffer
    assert Sum(ALiBi(2), Uniform()).spec() == [dict(name="alibi"), dict(name="uniform")]


def test_a_copy_describes_itself_as_the_original():
    prior = GOAT(4, 2, sink=False)
    assert copy.deepcopy(prior).spec() == prior.spec()


class Unnamed(Prior):
    def __init__(self, num_heads: int, width: float = 1.0):
        super().__init__()
        self.num_heads = num_heads


def test_a_prior_not_registered_cannot_describe_itself():
    with pytest.raises(
        UnregisteredPrior, match="Unnamed is not a registered prior.*priorattn.priors.register"
    ):
        Unnamed(2).spec()
    with pytest.raises(UnregisteredPrior, match="Unnamed is not a registered prior"):
        Sum(ALiBi(2), Unnamed(2)).spec()


class Wrong(Prior):
    def __init__(
        self, num_heads: int, table: torch.Tensor | None = None, size: int = 3, *, shape: dict | None = None
    ):
        super().__init__()


class Worded(Prior):
    def __init__(self, num_heads: int, kind: str = "a"):
        super().__init__()


@pytest.mark.parametrize(
    "call, error, message",
    [
        (
            lambda: register("ggd", Wrong),
            ValueError,
            "cannot register Wrong as prior 'ggd': the name is GGD's",
        ),
        (
            lambda: register("ggd_again", GGD),
            ValueError,
            "cannot register GGD as prior 'ggd_again': it is 'ggd'",
        ),
        (lambda: register("not a name", Wrong), ValueError, "a prior's name must be an identifier"),
        (lambda: register("wrong", Wrong, width="?"), TypeError, "Wrong has no keyword argument 'width'"),
        (
            lambda: register("wrong", Wrong, num_heads="?"),
            TypeError,
            "no keyword argument 'num_heads' with a default",
        ),
        (lambda: register("wrong", Wrong, table="?"), TypeError, "option 'table' of Wrong is annotated"),
        (lambda: register("wrong", Wrong, shape="?"), TypeError, "option 'shape' of Wrong is annotated"),
        (
            lambda: register("wrong", Wrong, size=FromModel("?", "length")),
            ValueError,
            "FromModel key must be one of",
        ),
        (lambda: register("wrong", Wrong, size=Choice("?", ("3",))), TypeError, "it must be annotated str"),
        (
            lambda: register("wrong", Worded, kind=Choice("?", ("b", "c"))),
            TypeError,
            "option 'kind' of Worded is a Choice of \\['b', 'c'\\]: .* its default one of them",
        ),
        (
            lambda: register("wrong", Worded, kind=Choice("?", ("a", "b"), {True: "a", False: "c"})),
            TypeError,
            "its booleans read both true and false as words of them",
        ),
        (
            lambda: register("wrong", Worded, kind=Choice("?", ("a", "b"), {True: "a"})),
            TypeError,
            "its booleans read both true and false",
        ),
    ],
)
def test_a_bad_registration_is_refused(call, error, message):
    with pytest.raises(error, match=message):
        call()
    assert "wrong" not in names()


def test_registering_the_same_prior_again_changes_nothing():
    before = options("ggd")
    assert register("ggd", GGD) is GGD
    assert options("ggd") == before


def test_a_prior_without_num_heads_is_built_without_it():
    class Flat(Prior):
        def __init__(self, depth: int = 2):
            super().__init__()
            self.depth = nn.Parameter(torch.tensor(float(depth)))

    register("flat_for_test", Flat, depth="a number")
    assert build_prior("flat_for_test(depth=5)", 4).depth.item() == 5.0


def test_the_studies_names_are_models_not_priors_and_the_error_says_so():
    """``nope`` and ``bam`` are named models (:mod:`priorattn.models.named`), which a config
    resolves to their priors; the priors' own layer knows only priors, and says what the name is."""
    with pytest.raises(ValueError, match=r"unknown prior 'bam': use one of .*ggd.*; 'bam' is a model$"):
        build_prior("bam", 2)
    with pytest.raises(ValueError, match=r"unknown prior 'xpos': use one of [^;]*$"):
        build_prior("xpos", 2)
