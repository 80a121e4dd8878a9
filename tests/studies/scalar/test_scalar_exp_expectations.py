"""Every scalar experiment's caption that states a seed 002 expectation says whether the run agrees,
judged from the measured numbers: each judgement on numbers that agree and on numbers that do not."""

from __future__ import annotations

import pytest

from priorattn.figures import RunScale
from priorattn.studies.scalar import (
    alignment,
    context_length,
    goat,
    hybrid_vs_standard,
    length_rule,
    regularizer_ablation,
    sink,
)

FULL = RunScale(300, 300, 1.0)


def losses(**val_loss) -> dict:
    return {name: dict(val_loss=value) for name, value in val_loss.items()}


def taus(none: float, align: float, tau: float) -> dict:
    return {
        "none": dict(label="no regularizer", tau_curve=dict(tau=[0.1, none]), reg_tau=0.0),
        "align": dict(label="L_align", tau_curve=dict(tau=[0.1, align]), reg_tau=0.0),
        "align_tau": dict(label="L_align + L_tau", tau_curve=dict(tau=[0.1, tau]), reg_tau=0.01),
    }


def aligned(rho: tuple[float, float], mass: tuple[float, float]) -> dict:
    return {
        name: dict(alignment=dict(rank_correlation=r, nearest_mass={"8": m}))
        for name, r, m in zip(("hybrid", "align"), rho, mass)
    }


def sweep(first: float, last: float) -> list[dict]:
    return [
        dict(length=length, k={"8": dict(missed=dict(mean=1.0)), "32": dict(missed=dict(mean=missed))})
        for length, missed in ((128, first), (4096, last))
    ]


def sinks(near: float, far: float) -> dict:
    return {"hybrid + sink": [dict(by_nearest_distance=[near, 0.2, None, far, None])]}


def own(mass: float) -> dict:
    return {"own": dict(mass_captured=dict(nearest={"16": 0.1, "64": mass}))}


CASES = {  # name: (judge(measured, run), measured that agrees, measured that differs, what it says)
    "exp1 hybrid": (
        hybrid_vs_standard.expectation,
        losses(hybrid=2.10, scalar=2.40, standard=2.05),
        losses(hybrid=2.45, scalar=2.40, standard=2.05),  # the reversed order
        "the hybrid ends at 2.450 nats per byte, pure scalar at 2.400",
    ),
    "exp1 close to standard": (
        hybrid_vs_standard.expectation,
        losses(hybrid=2.10, scalar=2.40, standard=2.05),
        losses(hybrid=2.35, scalar=2.40, standard=2.05),  # below scalar, far from standard
        "the hybrid ends at 2.350",
    ),
    "exp2 alignment": (
        alignment.expectation,
        aligned(rho=(-0.5, -0.9), mass=(0.3, 0.7)),
        aligned(rho=(-0.94, -0.27), mass=(0.68, 0.25)),  # docs/scalar_experiments.md: L_align collapses
        "rho goes from -0.940 to -0.270 and the 8 nearest keys' mass from 0.680 -> 0.250",
    ),
    "exp3 tau": (
        regularizer_ablation.tau_expectation,
        taus(none=0.2, align=0.15, tau=0.05),
        taus(none=0.2, align=0.08, tau=0.05),  # one variant without L_tau ends below its start
        "tau ends at 0.200 (no regularizer), 0.080 (L_align), 0.050 (L_align + L_tau)",
    ),
    "exp4 window": (
        context_length.expectation,
        sweep(first=0.01, last=0.015),
        sweep(first=0.01, last=0.3),
        "a window of k = 32 misses 0.01 of the mass at 128 tokens and 0.3 at 4096",
    ),
    "exp5 sink": (
        sink.expectation,
        sinks(near=0.1, far=0.6),
        sinks(near=0.6, far=0.1),
        "hybrid + sink: 0.600 of the attention of queries with a key near, 0.100 of those farthest",
    ),
    "exp6 complementary": (
        goat.expectation,
        losses(hybrid_goat=2.0, goat=2.1, hybrid=2.2),
        losses(hybrid_goat=2.15, goat=2.1, hybrid=2.2),
        "hybrid + GOAT ends at 2.150 nats per byte, GOAT at 2.100",
    ),
    "exp8 local": (
        lambda scored, run: length_rule.expectation(scored, 256, run),
        own(mass=0.97),
        own(mass=0.31),
        "at 2048 bytes the 64 nearest scalar keys hold 0.310 of the own-tau model's mass",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_caption_says_whether_the_run_agrees_with_the_seed(case):
    judge, agreeing, differing, measured = CASES[case]
    assert "This run agrees:" in judge(agreeing, FULL)
    said = judge(differing, FULL)
    assert "This run differs:" in said and measured in said and "smoke" not in said
    assert judge(differing, RunScale(30, 300, 0.1)).endswith("(A smoke run: this judges nothing.)")


def test_a_window_size_that_was_not_measured_cannot_tell():
    measured = {
        name: dict(alignment=dict(rank_correlation=-0.5, nearest_mass={})) for name in ("hybrid", "align")
    }
    assert "This run cannot tell: " in alignment.expectation(measured, FULL)
    assert "This run cannot tell: " in length_rule.expectation(
        {"own": dict(mass_captured=dict(nearest={}))}, 256, FULL
    )
