"""Verdict rules on hand-made results: Wilson intervals on known counts, thresholds, winners and ties."""

from __future__ import annotations

import math

import pytest

from priorattn.eval.verdicts import (
    Estimate,
    Winner,
    compare_to,
    mean_interval,
    normal_interval,
    seed_interval,
    wilson_interval,
    winner,
)


@pytest.mark.parametrize(
    "successes, trials, low, high",
    [  # Wilson score intervals at 95% (Newcombe 1998, Table I; Brown, Cai and DasGupta 2001)
        (0, 10, 0.0, 0.2775),
        (10, 10, 0.7225, 1.0),
        (5, 10, 0.2366, 0.7634),
        (1, 10, 0.0179, 0.4042),
        (81, 263, 0.2553, 0.3662),
    ],
)
def test_wilson_interval_matches_published_values(successes, trials, low, high):
    e = wilson_interval(successes, trials)
    assert e.value == successes / trials
    assert (e.low, e.high) == pytest.approx((low, high), abs=5e-5)


def test_wilson_interval_is_exact_at_the_ends_and_narrows_with_trials():
    assert wilson_interval(0, 400).low == 0.0 and wilson_interval(400, 400).high == 1.0
    width = [wilson_interval(n // 2, n).high - wilson_interval(n // 2, n).low for n in (10, 100, 1000)]
    assert width == sorted(width, reverse=True)


def test_normal_and_mean_intervals():
    e = normal_interval(0.1, 0.01)
    assert (e.value, e.low, e.high) == pytest.approx((0.1, 0.1 - 0.0196, 0.1 + 0.0196), abs=1e-6)
    e = mean_interval([1.0, 2.0, 3.0])  # sample sd 1, se 1 / sqrt(3)
    half = 1.96 / math.sqrt(3)
    assert (e.value, e.low, e.high) == pytest.approx((2.0, 2 - half, 2 + half), abs=1e-4)
    assert mean_interval([0.5]) == Estimate(0.5, -math.inf, math.inf)
    assert mean_interval([0.25, 0.25, 0.25]) == Estimate(0.25, 0.25, 0.25)


def test_compare_to_says_within_noise_when_the_interval_holds_the_threshold():
    assert compare_to(normal_interval(0.05, 0.01), 0.0) == "above"
    assert compare_to(normal_interval(-0.05, 0.01), 0.0) == "below"
    assert compare_to(normal_interval(0.01, 0.01), 0.0) == "within noise"
    assert compare_to(mean_interval([3.0]), 0.0) == "within noise"


def test_a_tie_within_noise_names_everyone_not_separated_from_the_best():
    """The report's case: ALiBi's paired delta -0.0004 and GOAT's -0.0002 with standard errors
    ~0.001 do not separate; RoPE's +1.6 is far from both."""
    deltas = dict(
        alibi=normal_interval(-0.0004, 0.001),
        goat=normal_interval(-0.0002, 0.001),
        rope=normal_interval(1.6, 0.2),
    )
    assert winner(deltas, higher_is_better=False) == Winner(None, ["alibi", "goat"])
    one_lucky_answer = dict(a=wilson_interval(1, 400), b=wilson_interval(0, 400), c=wilson_interval(0, 400))
    assert winner(one_lucky_answer, higher_is_better=True) == Winner(None, ["a", "b", "c"])


def test_a_clear_win_is_declared_in_either_direction():
    accuracies = dict(a=wilson_interval(2, 40), b=wilson_interval(38, 40), c=wilson_interval(20, 40))
    assert winner(accuracies, higher_is_better=True) == Winner("b", [])
    ppl = dict(a=Estimate(6.0, 5.9, 6.1), b=Estimate(25.0, 20.0, 30.0))
    assert winner(ppl, higher_is_better=False) == Winner("a", [])
    assert winner(dict(only=Estimate(1.0, 0.0, 2.0)), higher_is_better=True) == Winner("only", [])


def test_an_accuracy_nobody_scored_is_nobodys_win():
    zeros = dict(a=wilson_interval(0, 40), b=wilson_interval(0, 40))
    assert winner(zeros, higher_is_better=True, nothing=0.0) == Winner(None, [])
    assert winner(zeros, higher_is_better=True) == Winner(None, ["a", "b"])  # without the rule: a tie
    some = dict(a=wilson_interval(0, 40), b=wilson_interval(30, 40))
    assert winner(some, higher_is_better=True, nothing=0.0) == Winner("b", [])


def test_seed_interval_holds_the_spread_between_seeds():
    agree, disagree = seed_interval([40, 40], 40), seed_interval([40, 22], 40)
    assert agree == wilson_interval(80, 80)  # no spread: the sequences' noise alone
    assert disagree.value == 62 / 80
    assert disagree.low < 22 / 40 + 0.05 and disagree.high == 1.0  # reaches both seeds
    pooled = wilson_interval(62, 80)
    assert disagree.low < pooled.low and agree.low > pooled.high  # Wilson alone would separate them
    assert disagree.high > agree.low  # these do not
    assert seed_interval([40, 22], 40) == disagree  # the same counts, the same interval


def test_seed_interval_of_one_seed_is_about_wilsons():
    one, wilson = seed_interval([20], 40), wilson_interval(20, 40)
    assert one.value == 0.5 and one.low <= wilson.low + 1e-9 and one.high >= wilson.high - 1e-9
    assert one.high - one.low < 1.1 * (wilson.high - wilson.low)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: wilson_interval(3, 0), "trials must be a positive int, got 0"),
        (lambda: wilson_interval(11, 10), r"successes must be an int in \[0, trials=10\], got 11"),
        (lambda: wilson_interval(2.5, 10), "successes must be an int"),
        (lambda: wilson_interval(1, 10, z=0), "z must be a positive finite number, got 0"),
        (lambda: normal_interval(0.0, -1.0), "se must be a finite number >= 0, got -1.0"),
        (lambda: normal_interval(0.0, math.nan), "se must be a finite number >= 0"),
        (lambda: mean_interval([]), "values must be a non-empty list of finite numbers"),
        (lambda: mean_interval([1.0, math.inf]), "values must be a non-empty list of finite numbers"),
        (lambda: Estimate(1.0, 2.0, 3.0), "finite value inside its interval"),
        (lambda: Estimate(math.nan, 0.0, 1.0), "finite value inside its interval"),
        (lambda: winner({}, True), "estimates must name at least one estimate"),
        (lambda: seed_interval([], 10), r"correct must hold one int in \[0, trials=10\] per seed, got \[\]"),
        (lambda: seed_interval([3, 11], 10), "correct must hold one int"),
        (lambda: seed_interval([3], 0), "trials must be a positive int, got 0"),
    ],
)
def test_bad_input_is_a_one_line_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()
