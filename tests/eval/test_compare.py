"""``compare`` end to end on a small corpus, its reuse of finished work, and the report's logic."""

from __future__ import annotations

import json

import pytest
from factories import word_salad

from priorattn.eval.compare import CompareConfig, compare
from priorattn.eval.report import seed_claims, winners


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
    )
    return CompareConfig(**base | overrides)


def test_compare_writes_the_report_and_reuses_finished_work(corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("PRIORATTN_CACHE", str(tmp_path / "cache"))
    config = small(corpus, niah_variants=["single_repeat"], seq_len=384, ppl_factors=[1, 2])
    lines = []
    data = compare(config, tmp_path / "out", progress=False, log=lines.append)
    report = (tmp_path / "out" / "report.html").read_text()
    for text in ("NoPE", "ALiBi", "data:image/png;base64,", "Winners", "Against the seeds' claims"):
        assert text in report
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved == json.loads(json.dumps(data))
    assert set(saved["models"]) == {"nope", "alibi"}
    for model in saved["models"].values():
        assert model["ppl"]["lengths"] == [384, 768]
        assert model["passkey"]["lengths"] == [384] and len(model["passkey"]["accuracy"][0]) == 2
        assert set(model["niah"]["variants"]) == {"single_repeat"}
    assert saved["config"]["steps"] == 2 and saved["summary"]["alibi"]["label"] == "ALiBi"
    metrics = (tmp_path / "out" / "models" / "alibi" / "metrics.jsonl").read_text()

    again = []
    compare(config, tmp_path / "out", progress=False, log=again.append)
    assert sum("reusing" in line for line in again) == 6  # 2 models x 3 evaluations
    assert (tmp_path / "out" / "models" / "alibi" / "metrics.jsonl").read_text() == metrics
    changed = []
    compare(small(corpus, niah_variants=["single_repeat"], seq_len=384, trials=2), tmp_path / "out",
            progress=False, log=changed.append)  # fmt: skip
    assert sum("reusing" in line for line in changed) == 2  # ppl only: the retrieval settings changed


def test_budget_scales_training_and_shrinks_a_smoke_run():
    assert CompareConfig.for_budget(1.0).steps == 600
    assert CompareConfig.for_budget(2.0).steps == 1200
    smoke = CompareConfig.for_budget(0.1)
    assert smoke.steps == 60 and max(smoke.ppl_factors) < 64 and smoke.trials == 1
    assert 32 in CompareConfig.for_budget(4).retrieval_factors
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="budget"):
            CompareConfig.for_budget(bad)
    with pytest.raises(ValueError, match="unknown model 'xpos'"):
        CompareConfig(models=["xpos"])


def test_every_model_differs_only_in_position():
    config = CompareConfig()
    configs = {name: config.model_config(name).to_dict() for name in config.models}
    positional = {"prior", "encoding", "window", "ssmax"}
    rest = [{k: v for k, v in c.items() if k not in positional} for c in configs.values()]
    assert all(r == rest[0] for r in rest)
    assert len({tuple(sorted((k, c[k]) for k in positional)) for c in configs.values()}) == len(configs)


def row(label, ratio=1.0, passkey=0.0, ppl=10.0, delta=0.0, niah=0.0, at_train_len=1.0):
    return dict(
        label=label, ppl_ratio=ratio, passkey_longest=passkey, passkey_beyond=passkey, ppl_longest=ppl,
        paired_delta_longest=delta, niah_beyond=niah, passkey_train_len=at_train_len,
    )  # fmt: skip


def test_claims_are_judged_by_their_thresholds():
    rows = dict(
        rope=row("RoPE", ratio=3.0),
        alibi=row("ALiBi", ratio=1.05, passkey=0.9),
        goat=row("GOAT", passkey=0.2),
    )
    claims = {
        claim.split(" ")[0] + str(i): agrees
        for i, (claim, _, agrees) in enumerate(seed_claims(rows, 4096, 1024))
    }
    assert claims == {"RoPE0": True, "ALiBi1": True, "ALiBi2": False, "GOAT3": False}


def test_winners_share_ties_and_pick_the_right_direction():
    rows = dict(a=row("A", ppl=5.0, passkey=0.5, delta=0.1), b=row("B", ppl=4.0, passkey=0.5, delta=-0.2))
    found = {metric: (labels, value) for metric, labels, value in winners(rows)}
    assert found["perplexity at the longest length"] == (["B"], 4.0)
    assert found["paired delta at the longest length"] == (["B"], -0.2)
    assert found["passkey accuracy past the training length"] == (["A", "B"], 0.5)


def test_an_accuracy_nobody_scored_has_no_winner():
    rows = dict(a=row("A"), b=row("B"))
    found = {metric: labels for metric, labels, _ in winners(rows)}
    assert found["passkey accuracy past the training length"] == []


def test_a_claim_about_far_retrieval_needs_retrieval_at_the_training_length():
    rows = dict(alibi=row("ALiBi", at_train_len=0.0), bam=row("BAM", passkey=0.0, at_train_len=0.2))
    verdicts = [agrees for claim, _, agrees in seed_claims(rows, 4096, 1024) if "retrieves" in claim]
    assert verdicts == [None, None]
