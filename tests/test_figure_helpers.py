"""priorattn.figures: what a study's figures and results say about its run (its scale, a smoke
run marked as such) and about a seed's expectation (whether the run agrees)."""

from __future__ import annotations

import pytest
from factories import figure_title

from priorattn.figures import RunScale, captioned_figure, save, seed_expectation


def test_a_run_below_the_default_budget_or_steps_is_a_smoke_run():
    assert not RunScale(300, 300, 1.0).smoke and not RunScale(600, 300, 2.0).smoke
    assert RunScale(30, 300, 0.1).smoke  # the budget and the steps below the default
    assert RunScale(300, 300, 0.999).smoke  # steps rounded up to the default, the budget below
    assert RunScale(3, 600, 1.0).smoke  # a config built with fewer steps than its default
    assert RunScale(30, 600).smoke and not RunScale(600, 600).smoke  # a study sized by steps alone
    assert RunScale(30, 300, 0.1).record() == dict(
        steps=30, default_steps=300, budget=0.1, up_to=False, smoke=True
    )


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(steps=0, default_steps=300), "steps must be an int >= 1, got 0"),
        (dict(steps=30, default_steps=True), "default_steps must be an int >= 1, got True"),
        (dict(steps=30, default_steps=300, budget=0.0), "budget must be a positive number or None"),
        (dict(steps=30, default_steps=300, budget=True), "budget must be a positive number or None"),
    ],
)
def test_a_bad_scale_is_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        RunScale(**fields)


def draw(path, run):
    fig, panel = captioned_figure((6, 3), "A caption.", run=run)
    panel.subplots().plot([0, 1], [1, 0])
    return save(fig, path)


def test_a_figure_states_its_runs_scale_above_its_panels_and_in_its_file(tmp_path):
    smoke = draw(tmp_path / "smoke.png", RunScale(30, 300, 0.1))
    assert figure_title(smoke) == (
        "SMOKE RUN (budget 0.1): 30 training steps per model, against 300 at the default budget; "
        "its numbers judge nothing"
    )
    full = draw(tmp_path / "full.png", RunScale(2000, 2000, 1.0, up_to=True))
    assert figure_title(full) == "up to 2000 training steps per model (budget 1)"
    assert figure_title(draw(tmp_path / "steps.png", RunScale(30, 600))).startswith(
        "SMOKE RUN: 30 training steps per model, against the default 600"
    )
    assert figure_title(draw(tmp_path / "none.png", None)) == ""  # a figure of no study run


@pytest.mark.parametrize(
    "agrees, verdict",
    [(True, "This run agrees"), (False, "This run differs"), (None, "This run cannot tell")],
)
def test_a_seed_expectation_says_whether_the_run_agrees(agrees, verdict):
    text = seed_expectation(
        "Seed 002 expects A below B.", agrees, "A ends at 2.0, B at 2.1.", RunScale(300, 300, 1)
    )
    assert text == f"Seed 002 expects A below B. {verdict}: A ends at 2.0, B at 2.1."
    smoke = seed_expectation("Seed 002 expects A below B.", agrees, "A ends at 2.0", RunScale(30, 300, 0.1))
    assert smoke.endswith("(A smoke run: this judges nothing.)")
