"""Training scalar-attention models: the seed 002 regularizers in the loss, metrics.jsonl and resume."""

from __future__ import annotations

import json

import pytest
from conftest import small_model, train_until_killed
from factories import exit_code
from test_loop import metrics, settings

from priorattn import cli
from priorattn.train import TrainConfig, load_run, resolve_configs, train
from priorattn.train.runs import run_configs, saved_configs


def test_regularizers_are_logged_from_their_start_step_and_resume_exactly(corpus, tmp_path, monkeypatch):
    regularizers = dict(reg_align=0.5, reg_spread=0.1, reg_spread_start=3, reg_tau=0.01)
    model = small_model(attention="hybrid", attention_options=dict(tau="token", **regularizers))
    config = settings(corpus)
    train(model, config, tmp_path / "whole", progress=False)
    records = metrics(tmp_path / "whole")
    assert {"reg_align", "reg_tau"} <= set(records[0]) and "reg_spread" not in records[0]  # step 2
    assert all("reg_spread" in r for r in records if r["step"] >= 4)
    train_until_killed(model, config, tmp_path / "split", monkeypatch)
    train(model, config, tmp_path / "split", resume=True, progress=False)

    def losses(run):
        return [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in metrics(run)]

    assert losses(tmp_path / "split") == losses(tmp_path / "whole")


def test_regularization_changes_the_training_loss_path(corpus, tmp_path):
    config = settings(corpus, steps=4, log_every=1)
    train(small_model(attention="scalar"), config, tmp_path / "plain", progress=False)
    regularized = small_model(attention="scalar", attention_options=dict(reg_align=5.0))
    train(regularized, config, tmp_path / "reg", progress=False)
    plain, reg = metrics(tmp_path / "plain"), metrics(tmp_path / "reg")
    assert plain[0]["train_loss"] == reg[0]["train_loss"]  # step 1: the same data and start...
    assert plain[-1]["train_loss"] != reg[-1]["train_loss"]  # ...then L_align moved the weights


def test_regularizers_need_scalar_heads():
    with pytest.raises(ValueError, match="attention='standard' has no option 'reg_tau'"):
        small_model(attention_options=dict(reg_tau=1.0))


def test_an_old_run_config_resumes_as_standard_without_regularizers():
    configs = run_configs(small_model(), TrainConfig())
    for part in configs.values():
        for name in [n for n in part if n in ("attention", "attention_options")]:
            del part[name]
    assert saved_configs(configs) == run_configs(small_model(), TrainConfig())


#: A scalar run's config.json as saved before the mechanisms owned their options: the scalar
#: heads' options flattened into the model, the regularizers in the train section.
FLATTENED_MODEL = dict(
    scalar_heads=1,
    scalar_groups=None,
    scalar_tau="token",
    scalar_tau_init=0.1,
    scalar_tau_cap=2.0,
    scalar_tau_length_scaling=None,
    scalar_sink=False,
)
FLATTENED_TRAIN = dict(
    reg_align=0.1,
    reg_spread=0.0,
    reg_tau=0.0,
    reg_align_start=0,
    reg_spread_start=0,
    reg_tau_start=0,
    reg_spread_range=None,
)


def flattened_run(model, train_config) -> dict:
    configs = run_configs(model, train_config)
    del configs["model"]["attention_options"]
    return dict(model=configs["model"] | FLATTENED_MODEL, train=configs["train"] | FLATTENED_TRAIN)


def test_a_run_saved_with_flattened_options_and_regularizers_loads_and_resumes_with_them(corpus, tmp_path):
    options = dict(heads=1, tau="token", tau_cap=2.0, reg_align=0.1, reg_spread_range=None)
    model = small_model(attention="mixed", attention_options=options)
    config = settings(corpus, steps=2)
    assert saved_configs(flattened_run(model, config)) == run_configs(model, config)
    run = tmp_path / "run"
    train(model, config, run, progress=False)
    (run / "config.json").write_text(json.dumps(flattened_run(model, config)))
    assert load_run(run).model_config == model
    resumed = settings(corpus, steps=3)
    model_config, train_config = resolve_configs(run, {}, dict(steps=3), resume=True)
    assert (model_config, train_config) == (model, resumed)
    train(model_config, train_config, run, resume=True, progress=False)  # the saved configs match
    model_config, _ = resolve_configs(run, dict(attention_options=dict(reg_align=0.2)), {}, resume=True)
    assert model_config.attention_options == model.attention_options.__class__(
        **options | dict(reg_align=0.2)
    )


def test_cli_trains_samples_and_reloads_a_mixed_model(corpus, tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["train", "--preset", "tiny", "--seq-len", "32", "--batch-size", "4", "--eval-sequences", "4"]
    argv += ["--quiet", "--steps", "2", "--data", str(corpus), "--out", str(run), "--attention", "mixed"]
    argv += ["--scalar-heads", "1", "--tau", "token", "--tau-cap", "2", "--reg-align", "0.1"]
    argv += ["--reg-spread", "0.1", "--reg-spread-range", "adaptive"]
    assert cli.main(argv) == 0
    saved = json.loads((run / "config.json").read_text())
    model = saved["model"]
    options = model["attention_options"]
    assert (model["attention"], options["heads"], options["tau_cap"]) == ("mixed", 1, 2.0)
    assert options["reg_spread_range"] is None and "reg_spread_range" not in saved["train"]
    assert load_run(run).model.blocks[0].attn.scalar.num_heads == 1
    capsys.readouterr()
    assert cli.main(["sample", "--run", str(run), "--prompt", "the quick", "--tokens", "8"]) == 0
    assert capsys.readouterr().out.startswith("the quick")
    sorted_argv = ["sample", "--run", str(run), "--prompt", "the quick", "--tokens", "8", "--greedy"]
    assert cli.main([*sorted_argv, "--sorted-window", "64"]) == 0  # the window holds every key
    sorted_out = capsys.readouterr().out
    assert cli.main(sorted_argv) == 0
    assert sorted_out == capsys.readouterr().out
    assert exit_code([*argv[:-8], "--attention", "scalar", "--encoding", "rope"]) == 2
    assert "attention='scalar' has none" in capsys.readouterr().err


@pytest.mark.slow
def test_greedy_generation_of_a_trained_scalar_model_through_a_sorted_window_is_full_attentions(
    corpus, tmp_path
):
    import torch

    from priorattn.scalar import SortedDecoding

    # A bandwidth capped at 2e-3 over keys that L_spread spreads on [-3, 3]: a few keys within reach
    # of each query, so 16 of the ~340 cached keys decide the next token (about 13 s of training).
    options = dict(tau_init=1e-3, tau_cap=2e-3, reg_spread=0.1)
    model = small_model(attention="scalar", seq_len=64, attention_options=options)
    config = settings(corpus, steps=150, batch_size=8, warmup_steps=10, eval_every=0, save_every=0)
    result = train(model, config, tmp_path / "run", progress=False)
    assert result.val_loss < result.unigram_loss  # it learnt something
    run = load_run(tmp_path / "run")
    prompt = torch.tensor([run.tokenizer.encode((corpus / "doc0.txt").read_text()[:300])])
    full = run.model.generate(prompt, 40, greedy=True)
    through_window = run.model.generate(
        prompt, 40, greedy=True, decoding="sorted", decoding_options=SortedDecoding(16, 16)
    )
    assert torch.equal(through_window, full)


def test_the_mean_bandwidth_is_logged_for_scalar_heads(corpus, tmp_path):
    """metrics.jsonl's ``tau``: the bandwidth of the step's forward pass (seed 002 experiment 3)."""
    config = settings(corpus, steps=2, log_every=1)
    scalar = small_model(attention="scalar", attention_options=dict(tau_init=0.3))
    train(scalar, config, tmp_path / "scalar", progress=False)
    records = metrics(tmp_path / "scalar")
    assert records[0]["tau"] == pytest.approx(0.3, rel=1e-5)  # step 1's forward pass: the start
    assert records[1]["tau"] != records[0]["tau"]
    train(small_model(), config, tmp_path / "standard", progress=False)
    assert not any("tau" in r for r in metrics(tmp_path / "standard"))
