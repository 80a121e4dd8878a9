"""Every command's ``--help`` shows the defaults the code holds: a config field's default from its
dataclass (change it, and the help changes), a hand-written option's through ``%(default)s``; no
help writes a default as text."""

from __future__ import annotations

import argparse
import dataclasses
import re

import pytest

from priorattn import cli
from priorattn.cli import train as train_command
from priorattn.cli.configs import help_text, shown


def parsers(parser: argparse.ArgumentParser, prog: str = "priorattn"):
    """``(prog, parser)`` of the command line and of every command and subcommand under it."""
    yield prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from parsers(sub, f"{prog} {name}")


def command(argv: list[str]) -> argparse.ArgumentParser:
    """The parser of ``priorattn ARGV...`` (a command, or a command's subcommand)."""
    return dict(parsers(cli.build_parser()))[" ".join(["priorattn", *argv])]


def printed_help(capsys, argv: list[str]) -> str:
    """``priorattn ARGV --help`` as printed, its whitespace made single spaces."""
    with pytest.raises(SystemExit):
        cli.main([*argv, "--help"])
    return " ".join(capsys.readouterr().out.split())


def with_default(config: type, name: str, value) -> type:
    """``config`` with field ``name`` defaulting to ``value`` (its docstring stays the base's)."""
    hints = {field.name: field.type for field in dataclasses.fields(config)}
    default = dataclasses.field(default_factory=lambda: value) if isinstance(value, list) else value
    frozen = config.__dataclass_params__.frozen
    fields = [(name, hints[name], default)]
    return dataclasses.make_dataclass(config.__name__, fields, bases=(config,), frozen=frozen)


# (command, module that holds the config, the config's name there, field, flag, new default, shown)
CASES = [
    (["train"], "priorattn.cli.train", "TrainConfig", "lr", "--lr", 0.0123, "0.0123"),
    (["train"], "priorattn.cli.train", "TrainConfig", "betas", "--betas", (0.8, 0.9), "0.8,0.9"),
    (["compare"], "priorattn.studies.compare.study", "CompareConfig", "seq_len", "--seq-len", 321, "321"),
    (
        ["compare"],
        "priorattn.studies.compare.study",
        "CompareConfig",
        "models",
        "--priors",
        ["rope", "goat"],
        "rope,goat",
    ),
    (
        ["retrieval"],
        "priorattn.studies.retrieval.study",
        "RetrievalStudyConfig",
        "train_len",
        "--train-len",
        96,
        "96",
    ),
    (
        ["retrieval"],
        "priorattn.studies.retrieval.study",
        "RetrievalStudyConfig",
        "steps",
        "--steps",
        1234,
        "1234; --budget scales it",
    ),
    (["dna"], "priorattn.studies.dna.config", "DNAConfig", "temperature", "--temperature", 0.7, "0.7"),
    (["dna"], "priorattn.studies.dna.config", "DNAConfig", "steps", "--steps", 77, "77; --budget scales it"),
    (["vision"], "priorattn.studies.vision.experiment", "VisionConfig", "lr", "--lr", 0.0042, "0.0042"),
    (["scalar-exp"], "priorattn.studies.scalar.common", "Settings", "seed", "--seed", 7, "7"),
    (["hf-extend"], "priorattn.hf.extend", "ExtendConfig", "steps", "--steps", 55, "55"),
    (["hf-extend"], "priorattn.hf.extend", "AddedPrior", "prior", "--prior", "alibi", "alibi"),
    (
        ["analyze", "copy-mixture"],
        "priorattn.studies.copy_mixture",
        "CopyMixtureConfig",
        "vocab_size",
        "--vocab-size",
        24,
        "24",
    ),
]


@pytest.mark.parametrize("argv, module, name, field, flag, value, text", CASES)
def test_a_default_changed_in_the_config_is_the_default_in_the_help(
    monkeypatch, capsys, argv, module, name, field, flag, value, text
):
    if module == "priorattn.hf.extend":
        pytest.importorskip("transformers")
    config = getattr(__import__(module, fromlist=[name]), name)
    before = next(f for f in dataclasses.fields(config) if f.name == field)
    monkeypatch.setattr(f"{module}.{name}", with_default(config, field, value))
    action = next(a for a in command(argv)._actions if flag in a.option_strings)
    assert help_text(action).endswith(f"({text})")
    old = shown(before.default if before.default is not dataclasses.MISSING else before.default_factory())
    assert f"({old}" not in help_text(action)
    assert f"({text})" in printed_help(capsys, argv)


def test_a_default_changed_in_an_evaluation_job_is_the_default_in_eval_help(monkeypatch, capsys):
    from priorattn import eval as evaluations

    monkeypatch.setitem(evaluations.ppl_job.__kwdefaults__, "windows", 13)
    monkeypatch.setitem(evaluations.passkey_job.__kwdefaults__, "depths", 11)
    assert "--windows WINDOWS windows per length (13)" in printed_help(capsys, ["eval", "ppl"])
    assert "--depths DEPTHS needle depths (11)" in printed_help(capsys, ["eval", "passkey"])


def test_the_train_models_flags_show_the_presets_and_the_budget_says_its_steps(monkeypatch):
    action = next(a for a in command(["train"])._actions if a.dest == "d_model")
    assert help_text(action).endswith("(the preset's)")
    dna = next(a for a in command(["dna"])._actions if a.dest == "budget")
    assert help_text(dna).endswith("(1.0: 400 steps)")


def restated_defaults(action: argparse.Action) -> list[str]:
    """What ``action``'s help (as written, before argparse fills it in) says of a default as text: a
    number in parentheses, or the action's own default or shown default in parentheses."""
    help = action.help or ""
    found = re.findall(r"\((-?\d[\d.,e+-]*)\)", help)
    values = [getattr(action, "shown_default", None)]
    if action.default not in (None, argparse.SUPPRESS) and not isinstance(action.default, bool):
        values += [shown(action.default), str(action.default)]
    return found + [value for value in values if value and f"({value}" in help]


def test_no_help_writes_a_default_as_text():
    written = {
        f"{prog} {'/'.join(action.option_strings) or action.dest}": restated_defaults(action)
        for prog, parser in parsers(cli.build_parser())
        for action in parser._actions
    }
    assert {flag: texts for flag, texts in written.items() if texts} == {}


def test_a_flag_the_helper_writes_shows_its_default_through_the_help_placeholder():
    for prog, parser in parsers(cli.build_parser()):
        for action in parser._actions:
            if hasattr(action, "shown_default") and not action.required:
                assert "%(shown_default)s" in action.help, (prog, action.option_strings)


def test_every_train_flag_that_a_bullet_documents_needs_no_help_of_its_own():
    flags = train_command.model_flags() | train_command.TRAIN_FLAGS
    assert [name for name, flag in flags.items() if flag.help is not None] == ["prior"]  # the registry's
