"""The retrieval study's protocol as options: a fixed step count against steps to a criterion, the
length curriculum, the priors' learning rate, each task's share of the training mixture."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import priorattn.studies.retrieval.study as study
from priorattn.data.synthetic import NEEDLE_TOKEN, SyntheticTask
from priorattn.studies.retrieval.run import run_retrieval_study
from priorattn.studies.retrieval.study import (
    RetrievalStudyConfig,
    curriculum_length,
    train_synthetic,
    training_batch,
)


def every_check_right(monkeypatch):
    monkeypatch.setattr(
        study, "exact_matches", lambda model, inputs, targets: torch.ones(len(inputs), dtype=bool)
    )


def test_with_a_fixed_step_count_training_runs_every_step_past_the_criterion(monkeypatch):
    every_check_right(monkeypatch)
    fields = dict(mechanisms=["nope"], steps=30, batch_size=2, curriculum_steps=10, check_every=5)
    _, stopped = train_synthetic(RetrievalStudyConfig(**fields, check_prompts=2), "nope", 0, progress=False)
    assert stopped["steps"] == 10
    config = RetrievalStudyConfig(**fields, check_prompts=2, stop_at_criterion=False)
    _, fixed = train_synthetic(config, "nope", 0, progress=False)
    assert fixed["steps"] == 30 and fixed["retrieves"]
    assert [c["step"] for c in fixed["checks"]] == [10, 15, 20, 25, 30]  # logged, not a reason to stop


def test_without_a_curriculum_every_step_reaches_the_training_length():
    config = RetrievalStudyConfig(curriculum_steps=0)
    assert [curriculum_length(config, 31, step) for step in (0, 1, 500)] == [64, 64, 64]


def test_the_first_check_without_a_curriculum_comes_after_check_every_steps(monkeypatch):
    every_check_right(monkeypatch)
    config = RetrievalStudyConfig(
        mechanisms=["nope"], steps=20, batch_size=2, curriculum_steps=0, check_every=5, check_prompts=2
    )
    _, log = train_synthetic(config, "nope", 0, progress=False)
    assert log["steps"] == 5 and log["checks"][0]["step"] == 5


def test_the_prior_learning_rate_reaches_the_priors_and_ssmax_only():
    config = RetrievalStudyConfig(mechanisms=["bam+ssmax"], prior_lr=2e-4)
    model = study.GPT(config.model_config("bam+ssmax"))
    optimizer = study.build_optimizer(model, config.train_config())
    prior_ids = {
        id(p)
        for block in model.blocks
        for module in (block.attn.prior, block.attn.ssmax)
        for p in module.parameters()
        if p.requires_grad
    }
    rates = {id(p): group["lr"] for group in optimizer.param_groups for p in group["params"]}
    assert prior_ids and {rates[i] for i in prior_ids} == {2e-4}
    assert {rate for i, rate in rates.items() if i not in prior_ids} == {config.lr}


def needles_per_row(inputs: torch.Tensor) -> list[int]:
    return (inputs == NEEDLE_TOKEN).sum(dim=1).tolist()


def test_task_weights_set_each_tasks_share_of_the_training_sequences():
    # a passkey row holds two needle markers (the needle and the question), a NIAH row four
    tasks = [SyntheticTask("passkey"), SyntheticTask("niah")]
    config = RetrievalStudyConfig(tasks=["passkey", "niah"], task_weights=[3, 1])
    assert config.task_shares() == [0.75, 0.25]
    inputs, _ = training_batch(tasks, 800, 64, np.random.default_rng(0), config.task_shares())
    counts = needles_per_row(inputs)
    assert set(counts) == {2, 4}
    assert 0.71 < counts.count(2) / len(counts) < 0.79  # 0.75 +- 3 standard errors
    inputs, _ = training_batch(tasks, 800, 64, np.random.default_rng(0), [0.1, 0.9])
    assert needles_per_row(inputs).count(2) / 800 < 0.14


def test_equal_shares_by_default_keep_the_data_stream_of_studies_run_before_task_weights():
    tasks = [SyntheticTask("passkey"), SyntheticTask("niah")]
    inputs, targets = training_batch(tasks, 6, 40, np.random.default_rng(5))
    rng = np.random.default_rng(5)
    rows = [tasks[int(rng.integers(2))].sample(40, float(rng.random()), rng) for _ in range(6)]
    assert torch.equal(inputs, torch.stack([torch.as_tensor(r.tokens[:-1]) for r in rows]))


@pytest.mark.parametrize(
    "weights, match",
    [
        ([1.0], "one weight per task"),
        ([1, 2, 3], "one weight per task"),
        ("1,2", "one weight per task"),
        ([1, 0], "positive numbers"),
        ([1, -2], "positive numbers"),
        ([1, float("nan")], "positive numbers"),
        ([1, float("inf")], "positive numbers"),
        ([True, 1], "positive numbers"),
    ],
)
def test_bad_task_weights_are_one_line_errors(weights, match):
    with pytest.raises(ValueError, match=match) as error:
        RetrievalStudyConfig(tasks=["passkey", "niah"], task_weights=weights)
    assert "\n" not in str(error.value)


def test_stop_at_criterion_must_be_a_bool():
    with pytest.raises(ValueError, match="stop_at_criterion must be True or False"):
        RetrievalStudyConfig(stop_at_criterion="no")


def test_a_model_is_retrained_when_its_protocol_changes_and_reused_under_equal_shares():
    default = RetrievalStudyConfig()
    settings = default.training_settings("bam", 0)
    assert "stop_at_criterion" not in settings and "task_shares" not in settings  # old models reused
    fixed = RetrievalStudyConfig(stop_at_criterion=False).training_settings("bam", 0)
    assert fixed["stop_at_criterion"] is False
    three_to_one = RetrievalStudyConfig(task_weights=[3, 1]).training_settings("bam", 0)
    assert three_to_one == RetrievalStudyConfig(task_weights=[0.75, 0.25]).training_settings("bam", 0)
    assert three_to_one["task_shares"] == [0.75, 0.25]
    for other in (dict(curriculum_steps=0), dict(prior_lr=3e-3)):
        assert RetrievalStudyConfig(**other).training_settings("bam", 0) != settings


def test_a_fixed_step_run_says_so_in_its_results_and_report(tmp_path):
    config = RetrievalStudyConfig(
        mechanisms=["nope"],
        seeds=[0],
        tasks=["passkey", "niah"],
        task_weights=[3, 1],
        stop_at_criterion=False,
        steps=4,
        batch_size=2,
        factors=[1, 2],
        prompts=1,
        depths=2,
    )
    data = run_retrieval_study(config, tmp_path, progress=False, log=lambda message: None)
    assert data["runs"]["nope"][0]["training"]["steps"] == 4
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["scale"]["up_to"] is False
    assert saved["config"]["stop_at_criterion"] is False and saved["config"]["task_weights"] == [3, 1]
    report = (tmp_path / "report.html").read_text()
    assert "for a fixed 4 steps" in report and "passkey (75% of the sequences)" in report.lower()


def test_the_retrieval_command_passes_the_protocol_options(tmp_path, monkeypatch):
    from priorattn import cli
    from priorattn.studies.retrieval import run as retrieval_run

    given = []
    monkeypatch.setattr(
        retrieval_run,
        "run_retrieval_study",
        lambda config, out, **options: given.append(config) or {"winners": []},
    )
    argv = ["retrieval", "--out", str(tmp_path), "--quiet", "--tasks", "latest,offset,text_passkey"]
    argv += ["--task-weights", "3,3,2", "--steps", "600", "--fixed-steps", "--curriculum-steps", "0"]
    assert cli.main(argv + ["--prior-lr", "0.003"]) == 0
    config = given[0]
    assert (config.steps, config.stop_at_criterion, config.curriculum_steps) == (600, False, 0)
    assert config.prior_lr == 0.003 and config.task_shares() == [0.375, 0.375, 0.25]

    given.clear()
    assert (
        cli.main(["retrieval", "--out", str(tmp_path), "--quiet", "--budget", "0.5", "--steps", "600"]) == 0
    )
    assert given[0].steps == 300 and given[0].stop_at_criterion  # --budget scales --steps
