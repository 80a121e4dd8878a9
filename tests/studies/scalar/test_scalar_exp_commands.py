"""``priorattn scalar-exp 2|4|5`` at a tiny budget: each writes a sensible results.json and its figure
(10-60 s each on the shared 2-core machine: ``-m slow``)."""

from __future__ import annotations

import json

import pytest
from factories import figure_title

from priorattn import cli
from priorattn.studies.scalar import Settings

#: Two steps of the tiny preset on windows of 32 tokens.
TINY = Settings(steps=2, seq_len=32, batch_size=2, evaluations=2, eval_sequences=2, windows=2, budget=0.01)


@pytest.fixture(autouse=True)
def tiny_budget(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIORATTN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(Settings, "for_budget", classmethod(lambda cls, budget=1.0, seed=0: TINY))


def run(number: int, out) -> dict:
    assert cli.main(["scalar-exp", str(number), "--out", str(out), "--quiet"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["experiment"] == number and results["settings"]["seq_len"] == 32
    for figure in results["figures"]:
        assert (out / figure).stat().st_size > 10_000
        assert figure_title(out / figure).startswith("SMOKE RUN (budget 0.01): 2 training steps per model")
    return results


@pytest.mark.slow
def test_experiment_2_measures_the_hybrid_without_and_with_l_align(tmp_path):
    results = run(2, tmp_path / "out")
    assert list(results["variants"]) == ["hybrid", "align", "align_x10", "all"]
    for variant in results["variants"].values():
        alignment = variant["alignment"]
        assert -1 <= alignment["rank_correlation"] <= 1 and alignment["l_align"] > 0
        assert len(alignment["layers"]) == 4  # the tiny preset's layers
        masses = list(alignment["nearest_mass"].values())
        assert masses == sorted(masses) and 0 < masses[0] and masses[-1] <= 1


@pytest.mark.slow
def test_experiment_4_sweeps_lengths_from_the_training_length(tmp_path):
    results = run(4, tmp_path / "out")
    assert list(results["variants"]) == ["hybrid", "all"]
    records = results["variants"]["all"]["lengths"]
    assert [r["length"] for r in records] == [32, 64, 128, 256, 512, 1024]
    for record in records:
        for k in ("8", "32"):
            missed = record["k"][k]["missed"]
            assert 0 <= missed["mean"] <= missed["max"] <= 1
            assert missed["max"] <= record["k"][k]["bound"]["max"] + 1e-9


@pytest.mark.slow
def test_experiment_5_measures_the_sinks_and_every_tau_curve(tmp_path):
    results = run(5, tmp_path / "out")
    variants = results["variants"]
    assert list(variants) == ["scalar", "scalar-sink", "hybrid", "hybrid-sink"]
    assert all(len(v["tau_curve"]["tau"]) == 2 for v in variants.values())
    assert "sink" not in variants["scalar"]
    records = variants["hybrid-sink"]["sink"]
    assert [r["length"] for r in records] == [32, 128, 512]
    assert all(0 < r["mean"] < 1 for r in records)


@pytest.mark.slow
def test_experiment_8_scores_the_length_rule_in_training_against_own_tau_and_at_inference(tmp_path):
    results = run(8, tmp_path / "out")
    assert list(results["variants"]) == ["own", "rule8", "rule16"]  # T of a training length of 64
    evaluations = results["evaluations"]
    assert list(evaluations) == ["own", "own_rule_at_inference", "rule8", "rule16"]
    own, at_inference = evaluations["own"], evaluations["own_rule_at_inference"]
    assert own["lengths"] == [64, 256, 1024, 4096]
    assert own["loss"][0] == at_inference["loss"][0]  # within the training length the rule is off
    assert own["loss"][1:] != at_inference["loss"][1:]
    saved = json.loads((tmp_path / "out" / "runs" / "rule8" / "config.json").read_text())["model"]
    options = saved["attention_options"]
    assert options["tau_length_scaling"] == 8 and options["tau_init"] == pytest.approx(6.4)
    for entry in evaluations.values():
        masses = list(entry["mass_captured"]["nearest"].values())
        assert masses == sorted(masses) and 0 < masses[0] and masses[-1] <= 1 + 1e-6
