"""Prior specs: the string grammar, the dict and list forms, their one canonical string, and building
a prior from a spec with what the model supplies."""

from __future__ import annotations

import json

import pytest

from priorattn.priors import (
    GGD,
    GOAT,
    ALiBi,
    Sum,
    Uniform,
    build_prior,
    canonical_spec,
    read_spec,
    with_defaults,
)


@pytest.mark.parametrize(
    "spec, data",
    [
        ("goat", dict(name="goat")),
        (" goat ( num_freqs = 4 , gate = TRUE ) ", dict(name="goat", num_freqs=4, gate=True)),
        (
            "goat(num_freqs=4, learnable_freqs=true)+alibi",
            [dict(name="goat", num_freqs=4, learnable_freqs=True), dict(name="alibi")],
        ),
        ("ggd(trainable=[alpha, mu], eps=1e-3)", dict(name="ggd", trainable=("alpha", "mu"), eps=1e-3)),
        ("ggd(trainable=mu)", dict(name="ggd", trainable=("mu",))),  # one word for a tuple of one
        ("ggd(trainable=[])", dict(name="ggd", trainable=())),
        ('goat(init="alibi", freq_base=500)', dict(name="goat", init="alibi", freq_base=500.0)),
        ('goat(init="a \\"b\\"")', dict(name="goat", init='a "b"')),
        ("goat(max_slope=inf)", dict(name="goat", max_slope=float("inf"))),
        ("goat(sink=false, slope=TRUE)", dict(name="goat", sink="none", slope="learned")),  # before issue 28
        (dict(name="goat", sink=True, slope=False), dict(name="goat", sink="shared", slope="none")),
        (dict(name="goat", num_freqs=4, freq_base=500), dict(name="goat", num_freqs=4, freq_base=500.0)),
        (dict(name="ggd", trainable=["mu"]), dict(name="ggd", trainable=("mu",))),
        (["alibi", dict(name="goat", gate=True)], [dict(name="alibi"), dict(name="goat", gate=True)]),
        (["ggd", "alibi+goat"], [dict(name="ggd"), [dict(name="alibi"), dict(name="goat")]]),
    ],
)
def test_every_form_reads_as_typed_plain_data(spec, data):
    assert read_spec(spec) == data


@pytest.mark.parametrize(
    "spec, canonical",
    [
        ("goat", "goat"),
        ("goat(num_freqs=8, sink=shared)", "goat"),  # options at their defaults say nothing
        ("goat(max_slope=2, num_freqs=3)", "goat(num_freqs=3, max_slope=2.0)"),  # constructor order
        ("goat(train_len=2048, init=uniform)", "goat(init=uniform, train_len=2048)"),  # the model's, kept
        (dict(name="ggd", trainable=["alpha", "mu"]), "ggd(trainable=[alpha, mu])"),
        ([dict(name="alibi"), "goat(slope=none)"], "alibi+goat(slope=none)"),
        (dict(name="goat", init="a b"), 'goat(init="a b")'),
        (dict(name="goat", init="true"), 'goat(init="true")'),
        ("goat(slope=false)", "goat(slope=none)"),  # a boolean of GOAT's sink or slope names its word
        ("goat(sink=true, slope=true)", "goat"),
        (json.loads('{"name": "goat", "sink": false, "slope": true}'), "goat(sink=none)"),
    ],
)
def test_a_spec_has_one_canonical_string_that_reads_back_the_same(spec, canonical):
    assert canonical_spec(spec) == canonical
    assert canonical_spec(canonical) == canonical
    assert canonical_spec(read_spec(canonical)) == canonical


@pytest.mark.parametrize(
    "spec, message",
    [
        ("xpos", r"unknown prior 'xpos': use one of alibi, .*ggd, goat"),
        ("alibi+rope", r"unknown prior 'rope'"),
        ("goat(R=4)", r"prior 'goat' has no option 'R': its options are num_freqs, sink, slope, gate, init"),
        ("alibi(slope=1)", r"prior 'alibi' has no option 'slope': its options are none"),
        ("goat(gate=maybe)", r"prior 'goat': option gate must be true or false, got 'maybe'"),
        (
            "goat(slope=maybe)",
            r"option slope must be one of learned, fixed, none \(true: learned, false: none\), got 'maybe'",
        ),
        (dict(name="goat", sink=1), r"option sink must be one of shared, per_head, none .*, got 1"),
        ('goat(sink=["none"])', r"option sink must be one of shared, per_head, none .*, got \['none'\]"),
        ("goat(num_freqs=2.5)", r"prior 'goat': option num_freqs must be an int, got '2.5'"),
        ("goat(freq_base=big)", r"prior 'goat': option freq_base must be a number, got 'big'"),
        ("goat(init=[a])", r"prior 'goat': option init must be a string, got \['a'\]"),
        ("goat(num_freqs=1, num_freqs=2)", r"prior 'goat': option num_freqs is given twice"),
        (
            "goat(num_freqs=4",
            r"cannot read prior spec 'goat\(num_freqs=4': expected ',' or '\)' at character 16",
        ),
        ("goat(num_freqs 4)", r"expected '=' after num_freqs at character 15, got '4'"),
        ("alibi+", r"expected a prior's name at character 6, got the end"),
        ("", r"cannot read prior spec '': expected a prior's name at character 0"),
        ("goat)", r"expected '\+' or the end at character 4, got '\)'"),
        ("goat;", r"cannot read prior spec 'goat;': unexpected ';'"),
        (dict(num_freqs=3), r"a prior spec dict needs a 'name'"),
        (dict(name="goat", gate="yes"), r"prior 'goat': option gate must be true or false, got 'yes'"),
        (dict(name="goat", num_freqs=True), r"option num_freqs must be an int, got True"),
        ([], r"a prior spec is a string, a dict or a non-empty list of specs, got \[\]"),
        (3, r"a prior spec is a string, a dict or a non-empty list of specs, got 3"),
    ],
)
def test_a_bad_spec_is_one_line_naming_what_is_wrong(spec, message):
    with pytest.raises(ValueError, match=message) as caught:
        read_spec(spec)
    assert "\n" not in str(caught.value)


def test_a_sum_inside_a_sum_has_no_string():
    with pytest.raises(ValueError, match="a sum inside a sum has no spec string: give it as a list"):
        canonical_spec(["ggd", "alibi+goat"])


def test_a_spec_builds_its_priors_in_order_and_sums_as_a_list_nests():
    prior = build_prior("goat(num_freqs=2, sink=false)+alibi", 4)
    assert isinstance(prior, Sum) and [type(p) for p in prior.parts] == [GOAT, ALiBi]
    assert prior.parts[0].alpha.shape == (4, 2) and prior.parts[0].sink is None
    nested = build_prior(["ggd", "alibi+goat"], 2)
    assert isinstance(nested.parts[1], Sum) and nested.spec()[1][0] == dict(name="alibi")
    assert isinstance(build_prior("uniform", 4), Uniform)
    assert isinstance(build_prior(["ggd"], 4), Sum)  # a list is a sum, even of one


def test_the_model_fills_the_options_a_spec_leaves_out_and_the_spec_wins():
    goat = build_prior("goat", 2, train_len=64, init="alibi")
    assert (goat.spec()["train_len"], goat.spec()["init"]) == (64, "alibi")  # the model's word is GOAT's
    assert goat.fold_slope().tolist() == pytest.approx([0.0625, 0.00390625])  # the ALiBi slopes of 2 heads
    own = build_prior("goat(train_len=16, init=uniform)", 2, train_len=64, init="alibi")
    assert (own.spec()["train_len"], own.spec()["init"]) == (16, "uniform")
    assert build_prior("ggd", 2, init="alibi").spec()["init"] == "alibi"
    assert build_prior("alibi", 2, train_len=64, init="alibi").spec() == dict(name="alibi")  # takes neither
    assert build_prior("goat", 2, train_len=None).spec()["train_len"] == 2048  # None: not supplied


def test_bad_context_and_refused_options_name_the_prior():
    with pytest.raises(TypeError, match=r"build_prior got unknown context \['seq_len'\]"):
        build_prior("goat", 2, seq_len=64)
    with pytest.raises(
        ValueError, match=r"prior 'goat': the model's init must be one of \['uniform', 'alibi'\]"
    ):
        build_prior("goat", 2, init="recency")
    with pytest.raises(ValueError, match=r"prior 'goat': num_freqs must be an int >= 0, got -1"):
        build_prior("goat(num_freqs=-1)", 2)
    with pytest.raises(ValueError, match=r"prior 'ggd': trainable names unknown parameters \['gamma'\]"):
        build_prior("ggd(trainable=[gamma])", 2)


def test_defaults_fill_the_named_priors_where_the_spec_leaves_them():
    assert with_defaults("alibi+goat(sink=none)", goat=dict(num_freqs=3)) == [
        dict(name="alibi"),
        dict(name="goat", num_freqs=3, sink="none"),
    ]
    assert with_defaults("goat(num_freqs=8)", goat=dict(num_freqs=3)) == dict(name="goat", num_freqs=8)
    assert with_defaults("ggd", goat=dict(num_freqs=3)) == dict(name="ggd")
    with pytest.raises(ValueError, match="prior 'goat' has no option 'R'"):
        with_defaults("ggd", goat=dict(R=3))
    assert isinstance(build_prior(with_defaults("ggd", ggd=dict(trainable=["mu"])), 2), GGD)
