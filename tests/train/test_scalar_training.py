"""Training scalar-attention models: the seed 002 regularizers in the loss, metrics.jsonl and resume."""

from __future__ import annotations

import json

import pytest
from conftest import small_model, train_until_killed
from factories import exit_code
from test_loop import metrics, settings

from priorattn import cli
from priorattn.train import TrainConfig, load_run, train
from priorattn.train.runs import run_configs, saved_configs


def test_regularizers_are_logged_from_their_start_step_and_resume_exactly(corpus, tmp_path, monkeypatch):
    model = small_model(attention="hybrid", scalar_tau="token")
    config = settings(corpus, reg_align=0.5, reg_spread=0.1, reg_spread_start=3, reg_tau=0.01)
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
    model = small_model(attention="scalar")
    train(model, settings(corpus, steps=4, log_every=1), tmp_path / "plain", progress=False)
    train(model, settings(corpus, steps=4, log_every=1, reg_align=5.0), tmp_path / "reg", progress=False)
    plain, reg = metrics(tmp_path / "plain"), metrics(tmp_path / "reg")
    assert plain[0]["train_loss"] == reg[0]["train_loss"]  # step 1: the same data and start...
    assert plain[-1]["train_loss"] != reg[-1]["train_loss"]  # ...then L_align moved the weights


def test_regularizers_need_scalar_heads(corpus, tmp_path):
    with pytest.raises(ValueError, match="need scalar heads"):
        train(small_model(), settings(corpus, reg_tau=1.0), tmp_path / "run", progress=False)


def test_an_old_run_config_resumes_as_standard_without_regularizers():
    configs = run_configs(small_model(), TrainConfig())
    for part in configs.values():
        for name in [n for n in part if n == "attention" or n.startswith(("scalar_", "reg_"))]:
            del part[name]
    assert saved_configs(configs) == run_configs(small_model(), TrainConfig())


def test_cli_trains_samples_and_reloads_a_mixed_model(corpus, tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["train", "--preset", "tiny", "--seq-len", "32", "--batch-size", "4", "--eval-sequences", "4"]
    argv += ["--quiet", "--steps", "2", "--data", str(corpus), "--out", str(run), "--attention", "mixed"]
    argv += ["--scalar-heads", "1", "--tau", "token", "--tau-cap", "2", "--reg-align", "0.1"]
    argv += ["--reg-spread", "0.1", "--reg-spread-range", "adaptive"]
    assert cli.main(argv) == 0
    saved = json.loads((run / "config.json").read_text())
    model = saved["model"]
    assert (model["attention"], model["scalar_heads"], model["scalar_tau_cap"]) == ("mixed", 1, 2.0)
    assert saved["train"]["reg_spread_range"] is None
    assert load_run(run).model.blocks[0].attn.scalar.num_heads == 1
    capsys.readouterr()
    assert cli.main(["sample", "--run", str(run), "--prompt", "the quick", "--tokens", "8"]) == 0
    assert capsys.readouterr().out.startswith("the quick")
    assert exit_code([*argv[:-8], "--attention", "scalar", "--encoding", "rope"]) == 2
    assert "attention='scalar' has none" in capsys.readouterr().err


def test_the_mean_bandwidth_is_logged_for_scalar_heads(corpus, tmp_path):
    """metrics.jsonl's ``tau``: the bandwidth of the step's forward pass (seed 002 experiment 3)."""
    config = settings(corpus, steps=2, log_every=1)
    train(small_model(attention="scalar", scalar_tau_init=0.3), config, tmp_path / "scalar", progress=False)
    records = metrics(tmp_path / "scalar")
    assert records[0]["tau"] == pytest.approx(0.3, rel=1e-5)  # step 1's forward pass: the start
    assert records[1]["tau"] != records[0]["tau"]
    train(small_model(), config, tmp_path / "standard", progress=False)
    assert not any("tau" in r for r in metrics(tmp_path / "standard"))
