"""Experiment 7, the regularizer weight search: its grid, the Pareto selection, bad input, and the
command at a tiny budget."""

from __future__ import annotations

import json

import pytest

from priorattn import cli
from priorattn.studies.scalar import Settings, weight_search
from priorattn.studies.scalar.weight_search import BASELINE, Grid, Setting, pareto_front, to_confirm

#: Two steps of the tiny preset on windows of 32 tokens.
TINY = Settings(steps=2, seq_len=32, batch_size=2, evaluations=2, eval_sequences=2, windows=2, budget=0.01)


def test_the_grid_is_every_combination_with_the_baseline_first_and_each_setting_once():
    grid = Grid(align=(0.0, 0.1), spread=(0.0, 0.1), tau=(0.01,), spread_range=((-3, 3), None))
    names = [s.name for s in grid.settings()]
    assert names[0] == "none" and len(names) == len(set(names)) == 7  # 2 aligns x (1 + 2 spreads) + none
    assert "align0.1_spread0.1-adaptive_tau0.01" in names and "spread0.1-range-3to3_tau0.01" in names
    assert [s.name for s in Grid(align=(0.0,), spread=(0.0,), tau=(0.0,)).settings()] == ["none"]


def test_a_setting_trains_a_hybrid_with_its_regularizers_and_spread_schedule():
    setting = Setting(align=0.01, spread=0.1, tau=0.1, spread_range=None, spread_start=0.25)
    variant = setting.variant(Settings(steps=200), "-seed1")
    assert variant.name == "align0.01_spread0.1-adaptive-from0.25_tau0.1-seed1"
    assert variant.model == dict(attention="hybrid")
    assert variant.train == {} and variant.options == dict(
        reg_align=0.01, reg_spread=0.1, reg_tau=0.1, reg_spread_range=None, reg_spread_start=50
    )
    assert BASELINE.name == "none"


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(align=-0.1), "the align regularizer weight must be a number >= 0, got -0.1"),
        (dict(tau=float("nan")), "the tau regularizer weight must be a number >= 0"),
        (dict(spread_range=(3.0, -3.0)), "spread_range must be"),
        (dict(spread_start=1.0), r"spread_start must be a fraction of the steps in \[0, 1\), got 1.0"),
    ],
)
def test_a_bad_setting_is_refused_naming_the_problem(fields, message):
    with pytest.raises(ValueError, match=message):
        Setting(**fields)
    axes = {name: (value,) for name, value in fields.items()}
    with pytest.raises(ValueError, match=message):
        Grid(**axes).settings()


def test_an_empty_grid_axis_is_refused():
    with pytest.raises(ValueError, match="the search grid's spread axis is empty"):
        Grid(spread=()).settings()


def test_the_pareto_front_keeps_what_no_other_point_beats_lowest_loss_first():
    points = {
        "none": (2.50, 0.70),
        "better_both": (2.49, 0.75),  # beats none
        "more_mass": (2.60, 0.90),
        "worse_both": (2.61, 0.60),
        "tie": (2.49, 0.75),  # equal to better_both: neither beats the other
        "same_loss_less_mass": (2.60, 0.80),  # beaten by more_mass
    }
    assert pareto_front(points) == ["better_both", "tie", "more_mass"]
    assert pareto_front({"only": (1.0, 0.5)}) == ["only"]
    with pytest.raises(ValueError, match="setting 'x' has no finite"):
        pareto_front({"x": (float("nan"), 0.5)})


def test_confirmation_takes_the_baseline_and_the_fronts_most_mass_within_the_loss_bound():
    def entry(loss, mass):
        return dict(val_loss=loss, mass_captured=dict(nearest={"8": mass}))

    results = {
        "none": entry(2.50, 0.70),
        "a": entry(2.49, 0.72),
        "b": entry(2.51, 0.80),
        "c": entry(2.515, 0.85),
        "far": entry(2.50 + weight_search.LOSS_BOUND + 0.01, 0.99),  # costs too much loss
    }
    front = pareto_front({n: (r["val_loss"], r["mass_captured"]["nearest"]["8"]) for n, r in results.items()})
    assert front == ["a", "b", "c", "far"]
    assert to_confirm(results, front) == ["none", "c", "b"]  # CONFIRM = 2, most mass first


def test_the_search_command_writes_every_setting_the_fronts_and_the_confirmation(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIORATTN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(Settings, "for_budget", classmethod(lambda cls, budget=1.0, seed=0: TINY))
    grid = Grid(align=(0.01,), spread=(0.1,), tau=(0.1,), spread_range=(None,))
    monkeypatch.setattr(weight_search, "GRID", grid)
    out = tmp_path / "out"
    assert cli.main(["scalar-exp", "7", "--out", str(out), "--quiet"]) == 0
    results = json.loads((out / "results.json").read_text())
    regularized = "align0.01_spread0.1-adaptive_tau0.1"
    assert list(results["variants"]) == ["none", regularized]
    for entry in results["variants"].values():
        nearest = entry["mass_captured"]["nearest"]
        assert 0 < nearest["8"] <= nearest["16"] <= 1 and entry["scalar_space"]["key_std"] > 0
        assert entry["tau"] == entry["tau_curve"]["tau"][-1] > 0
    assert results["variants"][regularized]["weights"]["spread_range"] is None
    assert set(results["pareto_fronts"]) == {"8", "16"}  # k below the windows' 32 tokens
    confirmation = results["confirmation"]
    assert confirmation["seed"] == 1 and list(confirmation["variants"])[0] == "none"
    assert set(confirmation["variants"]) <= {"none", regularized}
    assert (out / "runs" / "none-seed1").is_dir()
    assert (out / "pareto.png").stat().st_size > 10_000
