"""``resolve_configs``: a fresh run's configs, a resumed run's (the run's, with the fields given),
and a context extension's (the earlier run's model on its data)."""

from __future__ import annotations

import pytest

from priorattn.files import write_json_atomic
from priorattn.models import GPTConfig, preset
from priorattn.train import TrainConfig, resolve_configs
from priorattn.train.runs import CONFIG_JSON, run_configs


def saved_run(run_dir, model: GPTConfig, config: TrainConfig):
    """A run directory holding only the config.json that ``train`` writes first."""
    run_dir.mkdir()
    write_json_atomic(run_dir / CONFIG_JSON, run_configs(model, config))
    return run_dir


def test_a_fresh_run_is_the_preset_with_the_fields_given_sized_by_the_data(tmp_path):
    model, config = resolve_configs(tmp_path, {"prior": "goat"}, {"seq_len": 64, "steps": 5})
    assert model == preset("tiny", prior="goat", seq_len=64, vocab_size=256)
    assert config == TrainConfig(seq_len=64, steps=5)
    model, _ = resolve_configs(tmp_path, {}, {"tokenizer": "bpe", "vocab_size": 300}, preset="small")
    assert model == preset("small", vocab_size=300)


def test_a_model_field_given_wins_over_the_size_the_data_implies(tmp_path):
    model, config = resolve_configs(tmp_path, {"seq_len": 32}, {"seq_len": 64})
    assert (model.seq_len, config.seq_len) == (32, 64)


def test_resume_keeps_the_runs_configs_and_replaces_the_fields_given(tmp_path):
    run = saved_run(tmp_path / "run", preset("tiny", prior="ggd"), TrainConfig(lr=0.01, steps=2))
    model, config = resolve_configs(run, {}, {"steps": 3}, resume=True)
    assert model == preset("tiny", prior="ggd")
    assert config == TrainConfig(lr=0.01, steps=3)
    model, _ = resolve_configs(run, {"dropout": 0.1}, {}, resume=True)
    assert model == preset("tiny", prior="ggd", dropout=0.1)


def test_resume_with_a_preset_builds_the_model_afresh_on_the_runs_training_config(tmp_path):
    run = saved_run(tmp_path / "run", preset("tiny", prior="ggd"), TrainConfig(seq_len=32))
    model, config = resolve_configs(run, {}, {}, preset="tiny", resume=True)
    assert model == preset("tiny", seq_len=32)
    assert config == TrainConfig(seq_len=32)


def test_resume_where_no_run_is_yet_starts_a_fresh_one(tmp_path):
    model, config = resolve_configs(tmp_path / "new", {"prior": "alibi"}, {"steps": 4}, resume=True)
    assert (model, config) == (preset("tiny", prior="alibi"), TrainConfig(steps=4))


def test_init_from_is_the_earlier_model_on_the_earlier_data(tmp_path):
    earlier_model = preset("tiny", prior="ggd", seq_len=32)
    earlier = TrainConfig(data="texts", text_encoding="latin-1", val_fraction=0.2, seq_len=32, lr=0.01)
    short = saved_run(tmp_path / "short", earlier_model, earlier)
    model, config = resolve_configs(tmp_path / "long", {}, {"init_from": str(short), "seq_len": 64})
    assert model == earlier_model
    same_data = dict(data="texts", text_encoding="latin-1", val_fraction=0.2)
    assert config == TrainConfig(**same_data, seq_len=64, init_from=str(short))  # lr: not the data
    _, config = resolve_configs(tmp_path / "long", {}, {"init_from": str(short), "data": "other"})
    assert (config.data, config.text_encoding) == ("other", "latin-1")


def test_init_from_may_only_change_the_rope_interpolation_and_scaling(tmp_path):
    earlier_model = preset("tiny", encoding="rope", seq_len=32)
    short = saved_run(tmp_path / "short", earlier_model, TrainConfig(seq_len=32))
    extend = {"init_from": str(short), "seq_len": 64}
    model, _ = resolve_configs(tmp_path / "long", {"rope_interpolation": 2.0}, extend)
    assert model == preset("tiny", encoding="rope", seq_len=32, rope_interpolation=2.0)
    model, _ = resolve_configs(tmp_path / "long", {"rope_interpolation": 2.0, "rope_scaling": "yarn"}, extend)
    assert model == preset("tiny", encoding="rope", seq_len=32, rope_interpolation=2.0, rope_scaling="yarn")
    message = (
        r"^prior=, window= cannot be combined with init_from= \(the model is that run's; only "
        r"rope_interpolation= and rope_scaling= may change\)$"
    )
    with pytest.raises(ValueError, match=message):
        resolve_configs(tmp_path / "long", {"prior": "goat", "window": 8}, extend)
    with pytest.raises(ValueError, match=r"^preset= cannot be combined with init_from="):
        resolve_configs(tmp_path / "long", {}, extend, preset="small")
