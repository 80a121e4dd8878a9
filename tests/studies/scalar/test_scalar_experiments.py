"""The framework of ``priorattn scalar-exp``: budgets, the registry, trained variants reused, the
mass a sorted cache captures, and results.json."""

from __future__ import annotations

import json
import math

import pytest
import torch
from factories import exit_code, figure_title

from priorattn import cli
from priorattn.models import GPT, GPTConfig
from priorattn.scalar.layers import ScalarAttentionMap
from priorattn.studies import scalar as experiments
from priorattn.studies.scalar import Experiment, regularizer_ablation, run_experiment
from priorattn.studies.scalar.common import (
    Settings,
    Variant,
    attention_maps,
    chance_mass,
    heaviest_mass,
    mass_captured,
    measure_mass,
    metric_curve,
    recent_mass,
    train_variant,
    val_curve,
)

#: A few steps of a small model on short windows: seconds.
TINY = Settings(steps=2, seq_len=32, batch_size=2, evaluations=2, eval_sequences=2, windows=2, budget=0.01)
HYBRID = Variant("hybrid", "hybrid", dict(attention="hybrid"))


@pytest.fixture(scope="module", autouse=True)
def token_cache(tmp_path_factory):
    """The embedded corpus's token store goes to a temporary cache, not ~/.cache."""
    mp = pytest.MonkeyPatch()
    mp.setenv("PRIORATTN_CACHE", str(tmp_path_factory.mktemp("cache")))
    yield
    mp.undo()


def test_budget_scales_the_steps_and_seed_makes_a_replicate():
    assert Settings.for_budget().steps == 300 and Settings.for_budget(0.5).steps == 150
    assert Settings.for_budget(1e-9).steps == 2
    replicate = Settings.for_budget(seed=3)
    assert replicate.seed == 3 and Settings.for_budget().train_config(HYBRID).seed == 0
    assert replicate.train_config(HYBRID).seed == 3
    with pytest.raises(ValueError, match="seed must be an int >= 0"):
        Settings.for_budget(1.0, seed=-1)


@pytest.mark.parametrize("budget", [0, -1.0, math.nan, math.inf, True, "1"])
def test_a_budget_that_is_not_a_positive_number_is_refused(budget):
    with pytest.raises(ValueError, match="budget must be a positive finite number"):
        Settings.for_budget(budget)


def test_every_experiment_has_a_description_and_a_run():
    assert 1 in experiments.EXPERIMENTS
    for experiment in experiments.EXPERIMENTS.values():
        assert experiment.description and callable(experiment.run)


def test_an_unknown_experiment_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"no experiment 99: choose one of \[1"):
        run_experiment(99, tmp_path)
    assert not tmp_path.joinpath("results.json").exists()


def test_results_json_holds_the_experiment_its_settings_and_results(tmp_path, monkeypatch):
    seen = {}

    def run(settings, out, *, progress, log):
        seen.update(settings=settings, out=out)
        return dict(figures=[], answer=42)

    monkeypatch.setitem(experiments.EXPERIMENTS, 7, Experiment("a test", run))
    results = run_experiment(7, tmp_path / "out", budget=0.5, seed=2, progress=False)
    assert json.loads((tmp_path / "out" / "results.json").read_text()) == results
    assert results["experiment"] == 7 and results["description"] == "a test" and results["budget"] == 0.5
    assert results["settings"]["steps"] == 150 == seen["settings"].steps and results["answer"] == 42
    assert results["settings"]["seed"] == 2
    assert results["scale"] == dict(steps=150, default_steps=300, budget=0.5, up_to=False, smoke=True)
    full = run_experiment(7, tmp_path / "full", progress=False)["scale"]
    assert (full["steps"], full["smoke"]) == (300, False)


def test_a_finished_variant_is_reused_and_other_settings_are_refused(tmp_path):
    first = train_variant(HYBRID, TINY, tmp_path, progress=False, log=lambda _: None)
    assert first.run_dir == tmp_path / "runs" / "hybrid" and first.step == 2
    metrics = (first.run_dir / "metrics.jsonl").read_text()
    again = train_variant(HYBRID, TINY, tmp_path, progress=False, log=lambda _: None)
    assert (first.run_dir / "metrics.jsonl").read_text() == metrics  # nothing trained again
    assert again.val_loss == first.val_loss
    assert val_curve(first.run_dir)["steps"] == [1, 2]  # evaluations: TINY.evaluations
    assert len(metric_curve(first.run_dir, "tau")["tau"]) == 2  # logged every step of 2
    other = Settings(**{**TINY.__dict__, "batch_size": 4})
    with pytest.raises(ValueError, match="batch_size"):
        train_variant(HYBRID, other, tmp_path, progress=False, log=lambda _: None)
    mass = measure_mass(first.run_dir, TINY, ks=(8, 16))
    assert set(mass) == {"nearest", "heaviest", "recent", "chance"} and set(mass["nearest"]) == {"8", "16"}
    assert 0 < mass["nearest"]["8"] < mass["nearest"]["16"] <= 1
    assert all(mass["nearest"][k] <= mass["heaviest"][k] + 1e-12 for k in ("8", "16"))


def hand_map(weights, q_s, k_s, sink_weight=None) -> ScalarAttentionMap:
    weights, q_s, k_s = (torch.tensor(t, dtype=torch.float64)[None, None] for t in (weights, q_s, k_s))
    sink = None if sink_weight is None else torch.tensor(sink_weight, dtype=torch.float64)[None, None]
    return ScalarAttentionMap(weights, sink, q_s, k_s, torch.ones_like(q_s))


def test_mass_captured_is_the_weight_of_the_nearest_keys_by_scalar_distance():
    """Keys at scalar 2, 0, 1 and queries at 0: the nearest key is the second, then the third."""
    weights = [[1.0, 0.0, 0.0], [0.4, 0.6, 0.0], [0.2, 0.5, 0.3]]
    plain = hand_map(weights, [0.0, 0.0, 0.0], [2.0, 0.0, 1.0])
    mass = mass_captured([plain], ks=(1, 2, 3))
    assert mass[1] == pytest.approx((0.6 + 0.5) / 2)  # queries 1 and 2 see more than one key
    assert mass[2] == pytest.approx(0.5 + 0.3)  # query 2 alone sees more than two
    assert math.isnan(mass[3])  # no query sees more than three
    sink = hand_map(
        [[0.5, 0.0, 0.0], [0.2, 0.3, 0.0], [0.1, 0.2, 0.2]], [0.0] * 3, [2.0, 0.0, 1.0], [0.5] * 3
    )
    assert mass_captured([sink], ks=(1,))[1] == pytest.approx((0.5 + 0.3 + 0.5 + 0.2) / 2)  # + the sink
    assert mass_captured([plain, sink], ks=(2,))[2] == pytest.approx((0.8 + 0.9) / 2)  # over layers too


def test_heaviest_mass_is_the_top_weights_and_chance_the_share_of_keys():
    weights = [[1.0, 0.0, 0.0], [0.4, 0.6, 0.0], [0.2, 0.5, 0.3]]
    assert heaviest_mass([hand_map(weights, [0.0] * 3, [0.0] * 3)], ks=(1,))[1] == pytest.approx(
        (0.6 + 0.5) / 2
    )
    assert chance_mass(3, ks=(1, 2)) == pytest.approx({1: (1 / 2 + 1 / 3) / 2, 2: 2 / 3})
    assert recent_mass([hand_map(weights, [0.0] * 3, [0.0] * 3)], ks=(1, 2)) == pytest.approx(
        {1: (0.6 + 0.3) / 2, 2: 0.8}
    )


def test_scalar_space_is_the_key_spread_and_the_weighted_scalar_term():
    """Keys 0, 1, 2 (std 1); query 2 at 0 with weights 0.5, 0.25, 0.25 and tau 1: 0.25 + 1."""
    weights = [[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.5, 0.25, 0.25]]
    space = regularizer_ablation.scalar_space([hand_map(weights, [0.0, 1.0, 0.0], [0.0, 1.0, 2.0])])
    assert space["key_std"] == pytest.approx(1.0)
    assert space["scaled_align"] == pytest.approx((0 + 0.5 + 1.25) / 3)


def test_mass_captured_needs_positive_k():
    with pytest.raises(ValueError, match="ks must be positive"):
        mass_captured([], ks=(0, 8))


def test_attention_maps_are_one_per_scalar_layer():
    config = GPTConfig(vocab_size=256, seq_len=16, d_model=32, n_layers=2, n_heads=4, attention="mixed")
    maps = attention_maps(GPT(config), torch.randint(0, 256, (3, 16)))
    assert len(maps) == 2 and maps[0].weights.shape == (3, 2, 16, 16)  # 2 scalar heads of 4
    with pytest.raises(ValueError, match="no scalar heads"):
        standard = GPTConfig(vocab_size=256, seq_len=4, d_model=32, n_layers=1, n_heads=2)
        attention_maps(GPT(standard), torch.zeros(1, 4).long())


def test_cli_refuses_an_unknown_experiment_and_a_bad_budget(tmp_path, capsys):
    assert exit_code(["scalar-exp", "99", "--out", str(tmp_path)]) == 2
    assert "invalid choice: 99" in capsys.readouterr().err
    assert exit_code(["scalar-exp", "1", "--out", str(tmp_path), "--budget", "0"]) == 2
    assert "must be a positive number" in capsys.readouterr().err


#: What each experiment trains, and which of them have scalar heads to measure.
TRAINED = {
    1: ({"standard", "scalar", "hybrid"}, {"scalar", "hybrid"}),
    3: (
        {"none", "align", "align_tau", "align_spread", "all"},
        {"none", "align", "align_tau", "align_spread", "all"},
    ),
    6: ({"standard", "goat", "hybrid", "hybrid_goat"}, {"hybrid", "hybrid_goat"}),
}


@pytest.mark.slow
@pytest.mark.parametrize("number", sorted(TRAINED))
def test_each_experiment_command_writes_its_results_and_figures(number, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["scalar-exp", str(number), "--out", str(out), "--budget", "0.01", "--quiet"]) == 0
    results = json.loads((out / "results.json").read_text())
    trained, measured = TRAINED[number]
    assert results["experiment"] == number and results["settings"]["steps"] == 3
    assert set(results["variants"]) == trained
    for name, entry in results["variants"].items():
        assert entry["val_curve"]["steps"][-1] == 3 and entry["val_loss"] < 6
        assert ("mass_captured" in entry) == (name in measured)
        if name in measured:
            assert 0 < entry["mass_captured"]["nearest"]["8"] <= entry["mass_captured"]["heaviest"]["8"] <= 1
    if number == 3:
        for entry in results["variants"].values():
            assert len(entry["tau_curve"]["tau"]) == 3 and entry["scalar_space"]["key_std"] > 0
    assert all((out / figure).stat().st_size > 0 for figure in results["figures"])
    assert results["scale"]["smoke"] and all(
        figure_title(out / figure).startswith("SMOKE RUN (budget 0.01): 3 training steps per model")
        for figure in results["figures"]
    )
    assert "results.json" in capsys.readouterr().out


def test_cli_passes_budget_and_seed(tmp_path, monkeypatch, capsys):
    calls = []

    def run(settings, out, *, progress, log):
        calls.append(settings)
        return dict(figures=["a.png"])

    monkeypatch.setitem(experiments.EXPERIMENTS, 1, Experiment("a test", run))
    argv = ["scalar-exp", "1", "--out", str(tmp_path), "--budget", "0.5", "--seed", "3", "--quiet"]
    assert cli.main(argv) == 0
    assert (calls[0].steps, calls[0].seed) == (150, 3) and "a.png" in capsys.readouterr().out
    assert exit_code(["scalar-exp", "1", "--out", str(tmp_path), "--seed", "-1"]) == 2
