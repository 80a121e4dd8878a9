"""The synthetic retrieval study: exact-match scoring, pooled intervals, the claim rules, the run."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from eval_fakes import InductionOracle
from factories import figure_title

from priorattn.data.synthetic import CONTENT_TASKS, SyntheticTask
from priorattn.encodings import YaRNRoPE
from priorattn.eval.synthetic import extended_rope, score_synthetic
from priorattn.models import GPT, GPTConfig
from priorattn.studies.retrieval.report import (
    fmt,
    seed_claims,
    ssmax_effects,
    summarize,
    winners,
)
from priorattn.studies.retrieval.run import run_retrieval_study
from priorattn.studies.retrieval.study import (
    DEFAULT_MECHANISMS,
    RetrievalStudyConfig,
    all_mechanisms,
    check_set,
    curriculum_length,
    label_of,
    position_of,
    trained_as,
)

SCORING = dict(depths=[0.0, 0.5, 1.0], prompts=2, seed=3, progress=False)


@pytest.mark.parametrize("name", CONTENT_TASKS)
def test_an_ideal_induction_model_scores_one_at_every_length_and_one_that_cannot_scores_zero(name):
    task = SyntheticTask(name)
    lengths = [task.min_length() + 8, 2 * task.min_length() + 40, 4 * task.min_length() + 100]
    right = score_synthetic(InductionOracle(task.vocab_size), task, lengths=lengths, **SCORING)
    wrong = score_synthetic(InductionOracle(task.vocab_size, wrong=True), task, lengths=lengths, **SCORING)
    assert right["correct"] == [[2, 2, 2]] * 3
    assert wrong["correct"] == [[0, 0, 0]] * 3
    assert right["lengths"] == lengths and right["prompts"] == 2


def test_every_model_is_scored_on_the_same_sequences():
    task = SyntheticTask("passkey")
    seen = []

    class Recorder(InductionOracle):
        def __call__(self, tokens, caches=None):
            seen.append(tokens.clone())
            return super().__call__(tokens, caches)

    for _ in range(2):
        score_synthetic(Recorder(task.vocab_size), task, lengths=[40], **SCORING)
    assert len(seen) == 6 and all(torch.equal(a, b) for a, b in zip(seen[:3], seen[3:]))


def test_scoring_refuses_bad_input_with_one_line():
    task = SyntheticTask("niah")
    model = InductionOracle(task.vocab_size)
    for bad, match in [
        (dict(lengths=[5]), "at least"),
        (dict(lengths=[0]), "lengths"),
        (dict(lengths=[64], prompts=0), "prompts"),
        (dict(lengths=[64], depths=[1.5]), "depths"),
    ]:
        options = SCORING | bad
        with pytest.raises(ValueError, match=match) as error:
            score_synthetic(model, task, **options)
        assert "\n" not in str(error.value)


def test_an_extension_is_applied_inside_the_block_and_undone():
    model = GPT(GPTConfig(vocab_size=16, seq_len=8, d_model=16, n_layers=2, n_heads=2, encoding="rope"))
    ropes = [block.attn.rope for block in model.blocks]
    with extended_rope(model, "pi", 4.0, 8):
        assert [block.attn.rope.interpolation for block in model.blocks] == [4.0, 4.0]
    with extended_rope(model, "yarn", 4.0, 8):
        assert all(isinstance(block.attn.rope, YaRNRoPE) for block in model.blocks)
        assert {(block.attn.rope.scale, block.attn.rope.original_len) for block in model.blocks} == {(4.0, 8)}
    assert [block.attn.rope for block in model.blocks] == ropes


@pytest.mark.parametrize("scaling", ["pi", "ntk", "yarn"])
def test_an_extension_scores_as_a_model_built_with_it_after_the_model_has_run(scaling):
    """A forward pass keeps each RoPE's rotations of its run of positions in a table; the scoring with
    an extension must not read the table made before it (the study trains, then scores)."""
    config = GPTConfig(vocab_size=16, seq_len=8, d_model=16, n_layers=2, n_heads=2, encoding="rope")
    torch.manual_seed(0)
    model = GPT(config).eval()
    built_with_it = GPT(GPTConfig(**config.to_dict() | dict(rope_interpolation=4.0, rope_scaling=scaling)))
    built_with_it.load_state_dict(model.state_dict())
    tokens = torch.randint(0, 16, (2, 12))
    with torch.no_grad():
        plain = model(tokens)[0]  # makes the tables
        with extended_rope(model, scaling, 4.0, 8):
            extended = model(tokens)[0]
        assert torch.equal(extended, built_with_it.eval()(tokens)[0])
        assert not torch.allclose(extended, plain)
        assert torch.equal(model(tokens)[0], plain)


def test_scoring_refuses_an_unknown_rope_scaling():
    task = SyntheticTask("passkey")
    with pytest.raises(ValueError, match="rope_scaling must be one of pi, ntk, yarn, got 'linear'"):
        score_synthetic(
            InductionOracle(task.vocab_size), task, lengths=[64], rope_scaling="linear", **SCORING
        )


def test_mechanism_names_ssmax_and_the_pi_model():
    assert position_of("bam+ssmax") == ("bam", True) and position_of("goat") == ("goat", False)
    assert trained_as("rope_pi+ssmax") == "rope+ssmax"
    assert trained_as("rope_ntk") == trained_as("rope_yarn") == "rope"
    assert len(DEFAULT_MECHANISMS) == 10
    config = RetrievalStudyConfig()
    assert config.model_config("bam+ssmax").ssmax and config.model_config("bam+ssmax").prior == "ggd"
    assert config.model_config("local_rope").window == config.train_len
    assert config.model_config("nope").token_shift


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(mechanisms=["bam+rope"]), "unknown mechanism"),
        (dict(mechanisms=[]), "at least one"),
        (dict(seeds=[0, 0]), "seeds"),
        (dict(seeds=[-1]), "seed"),
        (dict(tasks=["copy"]), "unknown task"),
        (dict(train_len=8), "too short"),
        (dict(factors=[2, 4]), "starting at 1"),
        (dict(factors=[1, 4, 2]), "increasing"),
        (dict(prompts=0), "prompts"),
        (dict(token_shift="yes"), "token_shift"),
    ],
)
def test_bad_study_settings_are_one_line_errors(fields, match):
    with pytest.raises(ValueError, match=match) as error:
        RetrievalStudyConfig(**fields)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("budget", [0, -1, float("nan"), float("inf"), True])
def test_a_bad_budget_is_a_one_line_error(budget):
    with pytest.raises(ValueError, match="budget"):
        RetrievalStudyConfig.for_budget(budget)


def test_budgets_scale_steps_and_lengths():
    smoke, full, long = (RetrievalStudyConfig.for_budget(b) for b in (0.1, 1, 2))
    assert smoke.smoke and not full.smoke
    assert smoke.steps < full.steps < long.steps
    assert full.factors[-1] == 64 and long.factors[-1] == 512


def fake_runs(config: RetrievalStudyConfig, counts: dict[str, list[list[int]]]) -> dict:
    """Runs whose every seed scored ``counts[mechanism][seed][length]`` on every depth of every task."""
    runs = {}
    for mechanism, per_seed in counts.items():
        runs[mechanism] = [
            dict(
                seed=seed,
                training=dict(final_loss=0.1, seconds=1.0, retrieves=per_seed[i][0] == config.prompts),
                learned=[],
                prior_curve=None,
                tasks={
                    task: dict(
                        lengths=config.lengths(),
                        depths=[0.0, 1.0],
                        prompts=config.prompts,
                        correct=[[c, c] for c in per_seed[i]],
                    )
                    for task in config.tasks
                },
            )
            for i, seed in enumerate(config.seeds)
        ]
    return runs


def small_config(mechanisms) -> RetrievalStudyConfig:
    return RetrievalStudyConfig(mechanisms=mechanisms, seeds=[0, 1], factors=[1, 2, 64], prompts=50, depths=2)


def test_counts_are_pooled_over_seeds_and_depths_with_intervals_that_hold_the_seeds():
    config = small_config(["rope"])
    summary = summarize(config, fake_runs(config, {"rope": [[50, 25, 0], [50, 15, 0]]}))
    passkey = summary["rope"]["tasks"]["passkey"]
    assert passkey["trials"] == 200 and passkey["correct"] == [200, 80, 0]
    assert passkey["accuracy"] == [1.0, 0.4, 0.0]
    assert passkey["per_seed"] == [[1.0, 0.5, 0.0], [1.0, 0.3, 0.0]]
    assert passkey["high"][2] == pytest.approx(0.01884, abs=1e-4)  # Wilson: 0 of 200
    assert passkey["low"][0] == pytest.approx(0.98116, abs=1e-4)
    assert passkey["low"][1] < 0.3 and passkey["high"][1] > 0.5  # both seeds inside, Wilson's is [0.34, 0.47]
    assert summary["rope"]["retrieves_at_train_len"] and summary["rope"]["seeds_at_criterion"] == 2


def claims_of(config, counts, task: str = "passkey") -> dict[str, dict]:
    """The verdicts on ``task``, by the claim's first word ("BAM SSMax" for BAM + SSMax's)."""
    return {
        c["claim"].split()[0] + (" SSMax" if "SSMax" in c["claim"] else ""): c
        for c in seed_claims(config, summarize(config, fake_runs(config, counts)))
        if c["task"] == task
    }


def test_claims_agree_differ_or_are_within_noise():
    config = small_config(["rope", "bam+ssmax", "alibi", "goat"])
    claims = claims_of(
        config,
        {
            "rope": [[50, 10, 0], [50, 10, 0]],  # collapses: agrees
            "bam+ssmax": [[50, 50, 50], [50, 50, 49]],  # keeps: agrees
            "alibi": [[50, 40, 46], [50, 40, 46]],  # stays: differs from "struggles"
            "goat": [[50, 50, 45], [50, 50, 45]],  # 0.90 at 64T: within noise of 0.9
        },
    )
    assert claims["RoPE"]["agrees"] is True
    assert claims["BAM SSMax"]["agrees"] is True
    assert claims["Even"]["agrees"] is False
    assert claims["GOAT"]["agrees"] is None and "within noise" in claims["GOAT"]["reason"]


def test_a_mechanism_that_does_not_retrieve_at_the_training_length_is_not_judged():
    config = small_config(["rope"])
    claims = claims_of(config, {"rope": [[40, 0, 0], [40, 0, 0]]})  # 0.80 at T
    assert claims["RoPE"]["agrees"] is None and "cannot be judged" in claims["RoPE"]["reason"]


def test_ssmax_effect_and_winner_name_a_tie_within_noise_and_a_clear_win():
    config = small_config(["bam", "bam+ssmax", "nope", "nope+ssmax"])
    summary = summarize(
        config,
        fake_runs(
            config,
            {
                "bam": [[50, 50, 30], [50, 50, 30]],
                "bam+ssmax": [[50, 50, 49], [50, 50, 50]],  # clearly better than BAM
                "nope": [[50, 10, 1], [50, 10, 0]],
                "nope+ssmax": [[50, 10, 0], [50, 10, 1]],  # the same as NoPE: a tie
            },
        ),
    )
    effects = {(e["position"], e["task"]): e for e in ssmax_effects(config, summary)}
    assert effects["bam", "passkey"]["winner"] == "BAM + SSMax"
    assert effects["nope", "passkey"]["winner"] is None and effects["nope", "passkey"]["judged"] is None
    best = winners(config, summary)
    assert best[0]["winner"] == "BAM + SSMax"


def test_a_claim_is_judged_on_each_task_it_is_about_and_names_it():
    config = RetrievalStudyConfig(
        mechanisms=["rope", "bam+ssmax"],
        tasks=["passkey", "latest"],
        seeds=[0, 1],
        factors=[1, 64],
        prompts=50,
        depths=2,
    )
    claims = seed_claims(
        config, summarize(config, fake_runs(config, {"rope": [[50, 0]] * 2, "bam+ssmax": [[50, 50]] * 2}))
    )
    judged = {(c["claim"].split()[0], c["task"]): c["agrees"] for c in claims}
    # RoPE's collapse is about retrieval on every task; BAM + SSMax's claim about the passkey only
    assert judged == {("RoPE", "passkey"): True, ("RoPE", "latest"): True, ("BAM", "passkey"): True}
    assert all("seeds used" in c["measured"] and "left out" in c["measured"] for c in claims)


def test_two_seeds_that_disagree_do_not_lose_to_two_that_agree():
    """40/40 and 22/40 against 40/40 and 40/40: pooled Wilson intervals would separate them
    ([0.68, 0.85] against [0.95, 1]); the seeds' spread makes it a tie."""
    config = RetrievalStudyConfig(
        mechanisms=["bam", "bam+ssmax"], seeds=[0, 1], factors=[1, 64], prompts=20, depths=2
    )
    summary = summarize(config, fake_runs(config, {"bam": [[20, 20]] * 2, "bam+ssmax": [[20, 20], [20, 11]]}))
    best = winners(config, summary)[0]
    assert best["winner"] is None and set(best["tied"]) == {"BAM", "BAM + SSMax"}


def test_a_tie_at_the_top_is_named():
    config = small_config(["bam", "bam+ssmax"])
    summary = summarize(
        config, fake_runs(config, {"bam": [[50, 50, 49]] * 2, "bam+ssmax": [[50, 50, 50]] * 2})
    )
    best = winners(config, summary)[0]
    assert best["winner"] is None and set(best["tied"]) == {"BAM", "BAM + SSMax"}


def test_the_study_runs_reuses_what_it_finished_and_retrains_on_new_settings(tmp_path):
    fields = dict(
        mechanisms=["alibi", "rope_pi", "rope_yarn"],
        seeds=[0],
        steps=6,
        batch_size=4,
        factors=[1, 2],
        prompts=1,
        depths=2,
    )
    messages = []
    data = run_retrieval_study(RetrievalStudyConfig(**fields), tmp_path, progress=False, log=messages.append)
    assert (tmp_path / "report.html").exists() and (tmp_path / "retrieval_accuracy.png").exists()
    saved = json.loads((tmp_path / "results.json").read_text())
    assert set(saved["summary"]) == {"alibi", "rope_pi", "rope_yarn"} and saved["config"]["steps"] == 6
    assert saved["scale"] == dict(steps=6, default_steps=2000, budget=1.0, up_to=True, smoke=True)
    for figure in saved["figures"].values():  # fewer steps than the default: a smoke run
        assert figure_title(figure).startswith("SMOKE RUN (budget 1): up to 6 training steps per model")
    assert "SMOKE RUN (budget 1): up to 6 training steps" in (tmp_path / "report.html").read_text()
    rope_dir = tmp_path / "models" / "rope" / "seed-0"
    assert (rope_dir / "model.safetensors").exists()  # PI and YaRN score RoPE's model
    assert data["runs"]["alibi"][0]["tasks"]["passkey"]["lengths"] == [64, 128]
    assert (
        json.loads((rope_dir / "scores-rope_yarn.json").read_text())["settings"]["rope_extension"] == "yarn"
    )

    messages.clear()
    again = run_retrieval_study(RetrievalStudyConfig(**fields), tmp_path, progress=False, log=messages.append)
    assert sum("reusing" in m for m in messages) == 2 and not any("scoring" in m for m in messages)
    assert again["summary"] == json.loads(json.dumps(data["summary"]))

    # RoPE PI's scores saved before the extension replaced each RoPE (stale tables) are scored again
    pi_scores = rope_dir / "scores-rope_pi.json"
    old = json.loads(pi_scores.read_text())
    del old["settings"]["rope_extension"]
    pi_scores.write_text(json.dumps(old))
    messages.clear()
    run_retrieval_study(RetrievalStudyConfig(**fields), tmp_path, progress=False, log=messages.append)
    assert [m for m in messages if "scoring" in m] == ["RoPE PI, seed 0: scoring"]

    messages.clear()
    run_retrieval_study(
        RetrievalStudyConfig(**(fields | dict(steps=8))), tmp_path, progress=False, log=messages.append
    )
    assert not any("reusing" in m for m in messages) and sum("scoring" in m for m in messages) == 3


def test_learned_parameters_are_recorded_per_layer(tmp_path):
    fields = dict(
        mechanisms=["bam+ssmax", "goat"],
        seeds=[0],
        steps=4,
        batch_size=4,
        factors=[1, 2],
        prompts=1,
        depths=2,
    )
    data = run_retrieval_study(RetrievalStudyConfig(**fields), tmp_path, progress=False, log=lambda m: None)
    bam = data["runs"]["bam+ssmax"][0]["learned"]
    assert set(bam[0]) == {"ggd", "ssmax"} and len(bam[0]["ggd"]["alpha"]) == 2
    goat = data["runs"]["goat"][0]["learned"][1]["goat"]
    assert len(goat["slope"]) == 2 and np.asarray(goat["sink"]).shape == (2, 4)
    curve = data["runs"]["goat"][0]["prior_curve"]
    assert curve["distance"][0] == 0 and curve["distance"][-1] == 127


def test_training_stops_at_the_first_check_where_every_check_sequence_is_right(monkeypatch):
    import priorattn.studies.retrieval.study as study

    config = RetrievalStudyConfig(
        mechanisms=["nope"], steps=50, batch_size=2, curriculum_steps=10, check_every=5, check_prompts=3
    )
    monkeypatch.setattr(
        study, "exact_matches", lambda model, inputs, targets: torch.ones(len(inputs), dtype=bool)
    )
    _, log = study.train_synthetic(config, "nope", seed=0, progress=False)
    assert log["steps"] == 10 and log["retrieves"] and log["checks"] == [dict(step=10, accuracy=[1.0, 1.0])]

    monkeypatch.setattr(
        study, "exact_matches", lambda model, inputs, targets: torch.zeros(len(inputs), dtype=bool)
    )
    _, log = study.train_synthetic(config, "nope", seed=0, progress=False)
    assert log["steps"] == 50 and not log["retrieves"]
    assert [c["step"] for c in log["checks"]] == list(range(10, 51, 5))


def test_the_check_set_is_fixed_and_at_the_training_length():
    config = RetrievalStudyConfig(check_prompts=5)
    first, second = check_set(config), check_set(config)
    assert [x.shape for x, _ in first] == [(5, 63), (5, 63)]
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(first, second))


def test_the_curriculum_rises_to_the_training_length():
    config = RetrievalStudyConfig(curriculum_steps=100)
    lengths = [curriculum_length(config, 31, step) for step in (0, 50, 99, 100, 5000)]
    assert lengths == [31, 47, 63, 64, 64]


def test_a_seed_that_does_not_retrieve_at_the_training_length_is_left_out_of_the_pooled_numbers():
    config = small_config(["goat"])
    summary = summarize(config, fake_runs(config, {"goat": [[5, 5, 5], [50, 40, 10]]}))
    passkey = summary["goat"]["tasks"]["passkey"]
    assert passkey["seeds_used"] == [1] and passkey["seeds_left_out"] == [0]
    assert passkey["accuracy"] == [1.0, 0.8, 0.2] and passkey["trials"] == 100
    assert passkey["per_seed"][0] == [0.1, 0.1, 0.1]
    assert summary["goat"]["retrieves_at_train_len"]
    nobody = summarize(config, fake_runs(config, {"goat": [[5, 5, 5], [10, 0, 0]]}))["goat"]
    assert nobody["tasks"]["passkey"]["seeds_used"] == [0, 1] and not nobody["retrieves_at_train_len"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--mechanisms", "bam,xpos"], "unknown mechanism 'xpos'"),
        (["--seeds", "0,-1"], "must be an integer >= 0"),
        (["--tasks", "copy"], "unknown task 'copy'"),
        (["--train-len", "8"], "--train-len=8 is too short"),
        (["--budget", "0"], "must be a positive number"),
        (["--seeds", "1,1"], "seeds must be distinct"),
        (["--workers", "0"], "must be an integer >= 1"),
        (["--task-weights", "1,0"], "must be a positive number, got 0"),
        (["--task-weights", "1"], "--task-weights must give one weight per task"),
        (["--task-weights", "1,x"], "expected a number"),
        (["--steps", "0"], "must be an integer >= 1"),
        (["--curriculum-steps", "-1"], "must be an integer >= 0"),
        (["--prior-lr", "0"], "must be a positive number"),
    ],
)
def test_bad_input_to_the_retrieval_command_is_one_line_and_leaves_no_directory(
    tmp_path, capsys, args, message
):
    from priorattn import cli

    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exited:
        cli.main(["retrieval", "--out", str(out), "--quiet", *args])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not out.exists()


def test_fox_and_every_registered_prior_are_mechanisms_of_the_study():
    assert {"fox", "fox+ssmax", "t5", "kerple", "fire", "sandwich+ssmax"} <= set(all_mechanisms())
    config = RetrievalStudyConfig(mechanisms=["fox", "sandwich+ssmax"])
    fox = config.model_config("fox")
    assert (fox.attention, fox.prior, fox.encoding, fox.token_shift) == ("fox", "uniform", "none", True)
    assert config.model_config("sandwich+ssmax").prior == "sandwich"
    assert label_of("fox+ssmax") == "FoX + SSMax"


def test_the_retrieval_command_runs_the_study(tmp_path, monkeypatch, capsys):
    from priorattn import cli
    from priorattn.studies.retrieval import run as retrieval_run

    given = []
    monkeypatch.setattr(
        retrieval_run,
        "run_retrieval_study",
        lambda config, out, **options: (
            given.append((config, options))
            or {"winners": [{"task": "passkey", "winner": None, "tied": ["BAM + SSMax", "RoPE-PI"]}]}
        ),
    )
    argv = ["retrieval", "--out", str(tmp_path), "--mechanisms", "bam+ssmax,rope_pi", "--seeds", "0,3"]
    assert cli.main(argv + ["--no-token-shift", "--budget", "2", "--workers", "1", "--quiet"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[-2:] == [  # the console ends with the study's summary, then the report
        "retrieval (synthetic), passkey: a tie within noise between BAM + SSMax, RoPE-PI",
        f"report: {tmp_path / 'report.html'}",
    ]
    config, options = given[0]
    assert config.mechanisms == ["bam+ssmax", "rope_pi"] and config.seeds == [0, 3]
    assert not config.token_shift and config.factors[-1] == 512 and options["workers"] == 1


def test_learned_values_read_as_numbers_per_head_not_as_an_array():
    assert fmt([0.5, -1.23456, 2e-6]) == "0.5, -1.23, 2e-06"
    assert fmt(0.25) == "0.25"
    assert fmt([[0.0, 1.5], [2.25, -3.0]]) == "h0: 0, 1.5; h1: 2.25, -3"  # GOAT's sink: a row per head


def test_layers_with_equal_priors_are_drawn_once():
    from priorattn.studies.retrieval.figures import layer_groups

    fixed = [[[0.0, -1.0], [0.0, -2.0]]] * 3  # ALiBi: every layer the same
    assert layer_groups(fixed) == [("layers 0, 1, 2", fixed[0])]
    learned = [[[0.0, -1.0]], None, [[0.0, -3.0]], [[0.0, -1.0]]]
    assert layer_groups(learned) == [("layers 0, 3", [[0.0, -1.0]]), ("layer 2", [[0.0, -3.0]])]
