"""``priorattn train``'s flags come from ``GPTConfig`` and ``TrainConfig``: every field has one, a
field added to a config has one with no edit of the command line, and a bad value is one line."""

from __future__ import annotations

import argparse
import dataclasses
import typing

import pytest

from priorattn import cli
from priorattn.cli import train as train_command
from priorattn.mechanisms import options_classes
from priorattn.models import GPTConfig, preset
from priorattn.train import TrainConfig


def train_parser() -> argparse.ArgumentParser:
    commands = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices["train"]


def configs(*flags: str):
    return train_command.train_configs(cli.build_parser().parse_args(["train", "--out", "run", *flags]))


def test_every_field_of_both_configs_and_every_mechanism_option_has_a_flag():
    dests = {action.dest for action in train_parser()._actions if action.option_strings}
    for config in (GPTConfig, TrainConfig):
        assert {field.name for field in dataclasses.fields(config)} - {"attention_options"} <= dests
    for options in options_classes():
        assert {f"attention_options.{field.name}" for field in dataclasses.fields(options)} <= dests


def test_the_flags_that_had_none_reach_the_configs():
    model, config = configs("--betas", "0.8,0.99", "--min-lr-ratio", "0.2", "--d-model", "64")
    assert (config.betas, config.min_lr_ratio) == ((0.8, 0.99), 0.2)
    assert model == preset("tiny", d_model=64)
    model, _ = configs("--no-tie-embeddings", "--n-kv-heads", "2", "--prior", "goat(num_freqs=2)+alibi")
    assert (model.tie_embeddings, model.n_kv_heads, model.prior) == (False, 2, "goat(num_freqs=2)+alibi")


def test_a_renamed_flag_keeps_the_fields_name_as_an_alias():
    for flag in ("--warmup", "--warmup-steps"):
        assert configs(flag, "7")[1].warmup_steps == 7
    for flag in ("--tau", "--scalar-tau"):
        assert configs("--attention", "scalar", flag, "token")[0].attention_options.tau == "token"
    for flag in ("--scalar-heads", "--heads"):
        assert configs("--attention", "mixed", flag, "1")[0].attention_options.heads == 1


def test_flags_with_their_own_reading_keep_it():
    assert configs("--grad-clip", "0")[1].grad_clip is None
    hybrid = ("--attention", "hybrid")
    assert configs(*hybrid, "--reg-spread-range", "adaptive")[0].attention_options.reg_spread_range is None
    assert configs(*hybrid, "--reg-spread-range=-2,2")[0].attention_options.reg_spread_range == (-2.0, 2.0)
    assert configs("--normalizer", "1.5")[0].normalizer == 1.5
    model, _ = configs("--encoding", "rope", "--rope-scaling", "yarn", "--rope-interpolation", "4")
    assert (model.rope_scaling, model.rope_interpolation) == ("yarn", 4.0)


def documented(config: type, name: str, annotation: type, default, doc: str) -> type:
    """``config`` with one more field ``name``, documented by a bullet of its docstring."""
    extended = dataclasses.make_dataclass(
        config.__name__,
        [(name, annotation, dataclasses.field(default=default))],
        bases=(config,),
    )
    extended.__doc__ = f"{config.__doc__}\n    - ``{name}``: {doc}\n"
    return extended


@pytest.mark.parametrize(
    "config, field, annotation, default, argv, value, shown",
    [
        (TrainConfig, "warmdown_steps", int, 0, ["--warmdown-steps", "50"], 50, "0"),
        (GPTConfig, "qk_norm", bool, False, ["--qk-norm"], True, "the preset's"),
    ],
)
def test_a_field_added_to_a_config_is_a_flag_with_no_edit_of_the_command_line(
    monkeypatch, capsys, config, field, annotation, default, argv, value, shown
):
    extended = documented(config, field, annotation, default, "a field from a later issue.")
    monkeypatch.setattr(train_command, config.__name__, extended)
    args = cli.build_parser().parse_args(["train", "--out", "run", *argv])
    assert getattr(args, field) == value
    assert cli.configs.given(args, extended) == {field: value}
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    assert f"a field from a later issue. ({shown})" in " ".join(capsys.readouterr().out.split())


def test_a_field_removed_from_a_config_loses_its_flag_with_no_edit_of_the_command_line(monkeypatch):
    hints = typing.get_type_hints(TrainConfig)
    kept = [f for f in dataclasses.fields(TrainConfig) if f.name != "checkpoint_activations"]
    slim = dataclasses.make_dataclass(
        "TrainConfig", [(f.name, hints[f.name], dataclasses.field(default=f.default)) for f in kept]
    )
    slim.__doc__ = TrainConfig.__doc__
    monkeypatch.setattr(train_command, "TrainConfig", slim)
    dests = {action.dest for action in train_parser()._actions}
    assert "checkpoint_activations" not in dests and "steps" in dests


@pytest.mark.parametrize(
    "args, message",
    [
        (["--betas", "0.9"], "argument --betas: expected 2 comma-separated values, got '0.9'"),
        (["--betas", "0.9,1.5"], "--betas must be two numbers in [0, 1), got (0.9, 1.5)"),
        (["--min-lr-ratio", "2"], "--min-lr-ratio must be in [0, 1], got 2.0"),
        (["--d-model", "wide"], "argument --d-model: expected an integer, got 'wide'"),
        (["--dropout", "1"], "--dropout must be in [0, 1), got 1.0"),
        (["--prior", "goat(R=4)"], "prior 'goat' has no option 'R': its options are num_freqs, "),
        (["--ssmax=yes"], "argument --ssmax/--no-ssmax: ignored explicit argument 'yes'"),
        (["--window", "none", "--encoding", "local_rope"], "sliding window: give --window"),
        (["--rope-scaling", "linear"], "argument --rope-scaling: invalid choice: 'linear'"),
        (["--rope-scaling", "ntk"], "--rope-scaling='ntk' scales RoPE: it needs --encoding='rope'"),
        (
            ["--attention", "mixed", "--scalar-heads", "4"],
            "--scalar-heads must be in [1, n_heads - 1] = [1, 3]",
        ),
        (
            ["--tau", "token"],
            "--attention='standard' has no option 'tau': it takes none; 'tau' is an option of 'scalar'",
        ),
        (
            ["--attention", "hybrid", "--reg-align", "-1"],
            "the align regularizer weight must be a number >= 0",
        ),
    ],
)
def test_a_bad_value_is_one_line_and_leaves_no_run_directory(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exited:
        cli.main(["train", "--out", str(tmp_path / "run"), *args])
    assert exited.value.code == 2
    error, pointer = capsys.readouterr().err.splitlines()
    assert error.startswith("priorattn train: error: ") and message in error
    assert pointer == "For more information, try 'priorattn train --help'."
    assert not (tmp_path / "run").exists()
