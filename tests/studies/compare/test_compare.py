"""``compare`` end to end on a small corpus, its reuse of finished work, and the report's logic."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
from factories import figure_title, word_salad

from priorattn.eval.verdicts import Estimate, Winner, normal_interval, wilson_interval
from priorattn.studies.compare.report import (
    FLAT_TOLERANCE,
    NO_RETRIEVAL,
    WITHIN_NOISE,
    context_effect,
    seed_claims,
    summary_html,
    summary_lines,
    winner_text,
    winners,
)
from priorattn.studies.compare.study import CompareConfig, compare
from priorattn.studies.retrieval.study import RetrievalStudyConfig
from priorattn.train import checkpoint as ckpt


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Six documents of about 3 kB of word salad (one becomes the validation split)."""
    return word_salad(tmp_path_factory.mktemp("corpus"), "when shall we three meet again in thunder or rain")


def small(corpus, **overrides) -> CompareConfig:
    base = dict(
        models=["nope", "alibi"],
        data=str(corpus),
        seq_len=192,
        steps=2,
        batch_size=2,
        retrieval_mix=0.5,
        ppl_factors=[1, 2],
        ppl_windows=2,
        retrieval_factors=[1],
        passkey_depths=2,
        niah_depths=1,
        trials=1,
        niah_variants=["single_repeat", "multikey"],
        retrieval=None,
    )
    return CompareConfig(**base | overrides)


def test_compare_runs_the_retrieval_study_and_its_report_answers_the_retrieval_claims(corpus, tmp_path):
    study = RetrievalStudyConfig(
        mechanisms=["alibi", "bam+ssmax"],
        seeds=[0],
        steps=4,
        batch_size=4,
        factors=[1, 2],
        prompts=1,
        depths=2,
    )
    config = small(corpus, models=["alibi"], retrieval=study)
    data = compare(config, tmp_path / "out", progress=False, log=lambda line: None)
    report = (tmp_path / "out" / "report.html").read_text()
    study_texts = (
        "Retrieval beyond the training length (synthetic tasks)",
        "BAM + SSMax",
        "What the priors learned",
    )
    for text in study_texts:
        assert text in report
    # what a reader needs first: the title of both parts, the winners, and which papers "seed 00N" are
    assert "<title>priorattn: Positional mechanisms beyond the training length</title>" in report
    assert report.index("<h2>Summary</h2>") < report.index("Retrieval beyond the training length")
    assert "Retrieval (synthetic): no mechanism retrieves at T" in report  # 4 steps: none does
    assert "Language models (1), " in report
    assert "seed 003 is BAM: Bianchessi" in report and "seed 000 is GOAT: Litman and Guo" in report
    assert (tmp_path / "out" / "retrieval" / "results.json").exists()
    assert data["retrieval"]["seed_claims"][0]["claim"].startswith("BAM + SSMax keeps")
    assert data["config"]["retrieval"]["mechanisms"] == ["alibi", "bam+ssmax"]
    assert not any(claim["reason"] == NO_RETRIEVAL for claim in data["seed_claims"])


def test_the_retrieval_study_follows_the_budget_and_can_be_left_out():
    assert CompareConfig.for_budget(0.1).retrieval.smoke
    assert CompareConfig.for_budget(1).retrieval.steps == RetrievalStudyConfig().steps
    assert CompareConfig.for_budget(1, retrieval_mechanisms=["goat"]).retrieval.mechanisms == ["goat"]
    assert CompareConfig(retrieval=None).retrieval is None
    assert CompareConfig(retrieval=dict(mechanisms=["rope"])).retrieval.mechanisms == ["rope"]


def test_compare_writes_the_report_and_reuses_finished_work(corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("PRIORATTN_CACHE", str(tmp_path / "cache"))
    config = small(corpus, niah_variants=["single_repeat"], seq_len=384, ppl_factors=[1, 2])
    lines = []
    data = compare(config, tmp_path / "out", progress=False, log=lines.append)
    report = (tmp_path / "out" / "report.html").read_text()
    for text in (
        "NoPE",
        "ALiBi",
        "data:image/png;base64,",
        "Winners",
        "Against the seeds' claims",
        str(corpus),
    ):
        assert text in report
    assert "Shakespeare" not in report  # the corpus trained on is named
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved == json.loads(json.dumps(data))
    assert set(saved["models"]) == {"nope", "alibi"}
    for model in saved["models"].values():
        assert model["ppl"]["lengths"] == [384, 768] and len(model["ppl"]["loss_se"]) == 2
        assert model["passkey_at_T"]["lengths"] == [384] and len(model["passkey_at_T"]["accuracy"][0]) == 2
        assert model["passkey_at_T"]["checkpoint"]["step"] == 2
    assert saved["config"]["steps"] == 2 and saved["summary"]["alibi"]["label"] == "ALiBi"
    assert saved["scale"] == dict(steps=2, default_steps=600, budget=1.0, up_to=False, smoke=True)
    assert "SMOKE RUN (budget 1): 2 training steps per model" in report
    assert figure_title(tmp_path / "out" / "ppl.png").startswith("SMOKE RUN (budget 1): 2 training steps")
    metrics = (tmp_path / "out" / "models" / "alibi" / "metrics.jsonl").read_text()

    again = []
    compare(config, tmp_path / "out", progress=False, log=again.append)
    evaluated = sum(model["passkey"] is not None for model in saved["models"].values())
    assert sum("reusing" in line for line in again) == 4 + 2 * evaluated  # ppl and passkey at T
    assert (tmp_path / "out" / "models" / "alibi" / "metrics.jsonl").read_text() == metrics
    changed = []
    compare(small(corpus, niah_variants=["single_repeat"], seq_len=384, trials=2), tmp_path / "out",
            progress=False, log=changed.append)  # fmt: skip
    assert sum("reusing" in line for line in changed) == 2  # ppl only: the retrieval settings changed


def test_a_run_trained_further_is_evaluated_again(corpus, tmp_path, monkeypatch):
    """``compare`` at one budget, then at a larger one into the same out: the models train on, and
    the evaluations of the older checkpoint are not reused beside the new validation loss."""
    monkeypatch.setenv("PRIORATTN_CACHE", str(tmp_path / "cache"))
    compare(small(corpus, models=["alibi"]), tmp_path / "out", progress=False, log=lambda line: None)
    lines = []
    data = compare(
        small(corpus, models=["alibi"], steps=4), tmp_path / "out", progress=False, log=lines.append
    )
    assert not any("reusing" in line for line in lines)
    index = json.loads((tmp_path / "out" / "models" / "alibi" / "checkpoint-00000004.json").read_text())
    for task in ("ppl", "passkey_at_T"):
        assert data["models"]["alibi"][task]["checkpoint"] == dict(step=4, sha256=index["sha256"])


def test_a_model_trained_with_other_settings_is_named_not_reused(corpus, tmp_path, monkeypatch):
    """An out holding a GOAT trained as an earlier priorattn did (``prior_init="uniform"``, its
    default before GOAT started seeded): ``compare`` stops before training, naming the directory,
    the field and what to do, rather than reporting that GOAT as today's."""
    monkeypatch.setenv("PRIORATTN_CACHE", str(tmp_path / "cache"))
    today = CompareConfig.model_config
    monkeypatch.setattr(
        CompareConfig, "model_config", lambda self, name: replace(today(self, name), prior_init="uniform")
    )
    compare(small(corpus, models=["goat"]), tmp_path / "out", progress=False, log=lambda line: None)
    monkeypatch.setattr(CompareConfig, "model_config", today)
    run = tmp_path / "out" / "models" / "goat"
    message = (
        f"{run} holds a GOAT model trained with other settings than this study's "
        "(model.prior_init: run has 'uniform', given None): remove it, or give another --out"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        compare(small(corpus, models=["goat"]), tmp_path / "out", progress=False, log=lambda line: None)


def test_longer_retrieval_runs_only_for_models_that_retrieve_at_T(corpus, tmp_path, monkeypatch):
    """A model below RETRIEVES at T gets no passkey past T and no NIAH, and the report says so;
    one at or above it gets both, with their tables."""
    from priorattn.studies.compare import study as compare_module

    monkeypatch.setenv("PRIORATTN_CACHE", str(tmp_path / "cache"))
    config = small(corpus, models=["nope"], retrieval_factors=[1, 2], niah_variants=["single_repeat"])
    skipped = compare(config, tmp_path / "skipped", progress=False, log=lambda line: None)
    assert skipped["models"]["nope"]["passkey_at_T"]["by_length"] == [0.0]  # two steps learn nothing
    assert skipped["models"]["nope"]["passkey"] is None and skipped["models"]["nope"]["niah"] is None
    assert skipped["summary"]["nope"]["passkey_beyond"] is None
    report = (tmp_path / "skipped" / "report.html").read_text()
    assert "Skipped for NoPE: their passkey accuracy at T is below 0.5" in report
    assert "No language model here retrieves at T" in report  # why the columns read 0 and dashes
    assert "Passkey accuracy per length" not in report and "Needle in a haystack" not in report

    monkeypatch.setattr(compare_module, "RETRIEVES", 0.0)  # every model now counts as retrieving
    evaluated = compare(config, tmp_path / "evaluated", progress=False, log=lambda line: None)
    nope = evaluated["models"]["nope"]
    assert nope["passkey"]["lengths"] == [192, 384] and nope["niah"]["variants"]["single_repeat"]["lengths"]
    report = (tmp_path / "evaluated" / "report.html").read_text()
    assert (
        "Skipped for" not in report and "Passkey accuracy per length" in report and "single_repeat" in report
    )
    assert "No language model here retrieves at T" not in report


def test_budget_scales_training_and_shrinks_a_smoke_run():
    assert CompareConfig.for_budget(1.0).steps == 600
    assert CompareConfig.for_budget(2.0).steps == 1200
    smoke = CompareConfig.for_budget(0.1)
    assert smoke.scale.record() == dict(steps=60, default_steps=600, budget=0.1, up_to=False, smoke=True)
    assert not CompareConfig.for_budget(1.0).scale.smoke
    assert smoke.steps == 60 and max(smoke.ppl_factors) < 64 and smoke.trials == 1
    assert 32 in CompareConfig.for_budget(4).retrieval_factors
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="budget"):
            CompareConfig.for_budget(bad)
    with pytest.raises(ValueError, match="unknown mechanism 'xpos'"):
        CompareConfig(models=["xpos"])


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(ppl_factors=[2, 4]), r"ppl_factors must be increasing ints starting at 1 \(T, as the report"),
        (dict(ppl_factors=[1]), "ppl_factors must be .*, with one past T, got \\[1\\]"),
        (dict(ppl_factors=[1, 4, 2]), "ppl_factors must be increasing"),
        (dict(retrieval_factors=[1, 1]), "retrieval_factors must be increasing"),
        (dict(retrieval_factors=[1, 2.5]), "retrieval_factors must be increasing ints"),
        (dict(retrieval_factors=[]), "retrieval_factors must be increasing ints starting at 1"),
        (dict(text_encoding="klingon"), "text_encoding='klingon' is not a known text encoding"),
    ],
)
def test_a_config_whose_first_length_is_not_T_is_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        CompareConfig(**fields)
    assert CompareConfig(retrieval_factors=[1]).retrieval_factors == [1]


def test_every_model_differs_only_in_position():
    config = CompareConfig()
    configs = {name: config.model_config(name).to_dict() for name in config.models}
    positional = {"prior", "encoding", "window", "ssmax"}
    rest = [{k: v for k, v in c.items() if k not in positional} for c in configs.values()]
    assert all(r == rest[0] for r in rest)
    assert len({tuple(sorted((k, c[k]) for k in positional)) for c in configs.values()}) == len(configs)


def test_fox_and_the_registered_priors_are_models_of_compare_and_its_retrieval_study(tmp_path, monkeypatch):
    from priorattn import cli
    from priorattn.studies.compare import study as compare_module

    given = []
    monkeypatch.setattr(
        compare_module, "compare", lambda config, out, progress: given.append(config) or {"winners": []}
    )
    argv = ["compare", "--out", str(tmp_path), "--priors", "fox,fox+ssmax,t5", "--retrieval-mechanisms"]
    assert cli.main(argv + ["fox,kerple+ssmax", "--quiet"]) == 0
    config = given[0]
    fox, fox_ssmax, t5 = (config.model_config(name) for name in config.models)
    assert (fox.attention, fox.prior, fox.encoding, fox.ssmax) == ("fox", "uniform", "none", False)
    assert (fox_ssmax.attention, fox_ssmax.ssmax) == ("fox", True)
    assert (t5.attention, t5.prior) == ("standard", "t5")
    study = config.retrieval
    assert study.model_config("fox").attention == "fox"
    assert study.model_config("kerple+ssmax").prior == "kerple"


def row(label, delta=(0.0, 0.001), ratio=1.0, ppl=10.0, at_T=(20, 20), passkey=None, niah=None):
    """A summary row made by hand: ``delta`` (mean, se), accuracies as (right, prompts); ``passkey``
    None: not evaluated past T (the model does not retrieve at T)."""
    return dict(
        label=label, ppl_ratio=ratio, ppl_longest=Estimate(ppl, 0.95 * ppl, 1.05 * ppl),
        paired_delta_longest=normal_interval(*delta), passkey_train_len=wilson_interval(*at_T),
        retrieves_at_T=passkey is not None,
        passkey_longest=passkey and wilson_interval(*passkey),
        passkey_beyond=passkey and wilson_interval(*passkey),
        niah_beyond=niah and wilson_interval(*niah),
    )  # fmt: skip


def verdicts(rows: dict) -> dict[str, tuple[bool | None, str]]:
    return {
        claim.claim.split(" (")[0]: (claim.agrees, claim.reason) for claim in seed_claims(rows, 4096, 1024)
    }


def test_context_claims_are_judged_from_the_paired_delta_not_the_ratio():
    rows = dict(
        rope=row("RoPE", delta=(1.6, 0.2), ratio=4.0),
        sinusoidal=row("Sinusoidal", delta=(0.05, 0.04), ratio=1.6),  # interval holds 0 and 0.1
        alibi=row("ALiBi", delta=(-0.0004, 0.001), ratio=1.3),  # a ratio over 1.2, yet flat
    )
    found = verdicts(rows)
    assert found["RoPE degrades past the training length"] == (True, "")
    assert found["Sinusoidal degrades past the training length"] == (None, WITHIN_NOISE)
    assert found["ALiBi stays flat past the training length"] == (True, "")
    measured = {c.claim.split(" ")[0]: c.measured for c in seed_claims(rows, 4096, 1024)}
    assert "degrades by 1.208 to 1.992 nats per byte" in measured["RoPE"] and "x4.00" in measured["RoPE"]
    flat_rope = verdicts(dict(rope=row("RoPE", delta=(0.005, 0.004), ratio=3.0)))
    assert flat_rope["RoPE degrades past the training length"] == (False, "")  # within the tolerance
    assert context_effect(normal_interval(FLAT_TOLERANCE + 0.01, 0.001)) == "degrades"
    assert context_effect(normal_interval(-0.5, 0.1)) == "flat"


def test_far_retrieval_claims_need_retrieval_at_T_and_an_interval_clear_of_the_threshold():
    rows = {
        "alibi": row("ALiBi", passkey=(0, 40)),
        "bam+ssmax": row("BAM + SSMax", passkey=(20, 40)),
        "goat": row("GOAT", passkey=(38, 40)),
    }
    found = verdicts(rows)
    assert found["ALiBi retrieves poorly far away"] == (True, "")
    assert found["BAM + SSMax retrieves far beyond the training length"] == (None, WITHIN_NOISE)
    assert found["GOAT retrieves far beyond the training length"] == (True, "")
    cannot = verdicts(dict(goat=row("GOAT", at_T=(0, 20)), alibi=row("ALiBi", at_T=(3, 20))))
    assert [v for claim, v in cannot.items() if "retrieves" in claim] == [(None, NO_RETRIEVAL)] * 2


def test_winners_are_declared_only_beyond_noise():
    rows = dict(
        alibi=row("ALiBi", delta=(-0.0004, 0.001), ppl=6.0, passkey=(1, 400)),
        goat=row("GOAT", delta=(-0.0002, 0.001), ppl=6.1, passkey=(0, 400)),
        rope=row("RoPE", delta=(1.6, 0.2), ppl=25.0),  # not evaluated past T
    )
    found = {metric: (w, estimates) for metric, w, estimates in winners(rows)}
    assert found["paired delta at the longest length"][0] == Winner(None, ["ALiBi", "GOAT"])
    assert found["perplexity at the longest length"][0] == Winner(None, ["ALiBi", "GOAT"])
    assert set(found["passkey accuracy past the training length"][1]) == {"ALiBi", "GOAT"}
    assert found["passkey accuracy past the training length"][0] == Winner(None, ["ALiBi", "GOAT"])
    assert "NIAH accuracy past the training length (all variants)" not in found  # nobody measured
    text = winner_text(*found["paired delta at the longest length"])
    assert text.startswith("tie: <b>ALiBi, GOAT</b> (within noise: ALiBi -0.000 [-0.002, +0.002]; GOAT")
    clear = dict(
        a=row("A", delta=(0.0, 0.001), passkey=(38, 40)), b=row("B", delta=(0.5, 0.01), passkey=(2, 40))
    )
    found = {metric: w for metric, w, _ in winners(clear)}
    assert found["paired delta at the longest length"] == Winner("A", [])
    assert found["passkey accuracy past the training length"] == Winner("A", [])


def test_an_accuracy_nobody_scored_has_no_winner():
    rows = dict(a=row("A", passkey=(0, 40)), b=row("B", passkey=(0, 40)))
    found = {metric: (w, estimates) for metric, w, estimates in winners(rows)}
    assert found["passkey accuracy past the training length"][0] == Winner(None, [])
    assert (
        winner_text(*found["passkey accuracy past the training length"]) == "no model (every model scores 0)"
    )


def test_a_damaged_checkpoint_is_named_and_the_run_continues_from_the_older(corpus, tmp_path, monkeypatch):
    """A truncated newest checkpoint: ``compare`` names it and the checkpoint it resumes from (one
    line on the command line: ``priorattn.cli.run_warnings_in_one_line``), trains the model to its
    steps again and scores what it then holds."""
    monkeypatch.setenv("PRIORATTN_CACHE", str(tmp_path / "cache"))
    for steps in (2, 4):  # two checkpoints
        compare(small(corpus, models=["alibi"], steps=steps), tmp_path / "out", progress=False, log=print)
    run = tmp_path / "out" / "models" / "alibi"
    newest = run / "checkpoint-00000004.safetensors"
    newest.write_bytes(newest.read_bytes()[:1000])
    warning = (
        r"checkpoint-00000004.safetensors is corrupted.*loading the older checkpoint checkpoint-00000002"
    )
    with pytest.warns(ckpt.CheckpointWarning, match=warning):
        data = compare(small(corpus, models=["alibi"], steps=4), tmp_path / "out", progress=False, log=print)
    index = json.loads((run / "checkpoint-00000004.json").read_text())
    assert data["models"]["alibi"]["ppl"]["checkpoint"] == dict(step=4, sha256=index["sha256"])


def test_the_summary_names_each_tasks_best_or_its_tie_first():
    retrieval = {
        "winners": [
            {"task": "passkey", "winner": "BAM + SSMax", "tied": []},
            {"task": "niah", "winner": None, "tied": ["NoPE", "BAM"]},
        ]
    }
    text = summary_html([], retrieval, 3)
    assert text.startswith("<h2>Summary</h2>")
    assert "passkey: <b>BAM + SSMax</b>" in text
    assert "multi-key NIAH: <b>a tie within noise between NoPE, BAM</b>" in text
    assert summary_html([], None, 3) == ""


def test_the_console_ends_with_the_same_summary_as_the_page():
    data = {
        "winners": [{"metric": "ppl at 4096", "winner": None, "tied": ["NoPE", "GOAT"]}],
        "retrieval": {"winners": [{"task": "passkey", "winner": "BAM", "tied": []}]},
    }
    assert summary_lines(data) == [  # the retrieval study's own lines first
        "retrieval (synthetic), passkey: BAM",
        "language models, ppl at 4096: a tie within noise between NoPE, GOAT",
    ]
    data["retrieval"]["winners"] = []
    assert summary_lines(data)[0].startswith("retrieval (synthetic): no mechanism retrieves at T")
