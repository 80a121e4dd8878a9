"""The command line: subcommands, their output, and clear errors for bad arguments."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
from factories import exit_code

from priorattn import cli


def test_help_lists_subcommands(capsys):
    assert exit_code(["--help"]) == 0
    assert "plot-priors" in capsys.readouterr().out


def test_plot_priors_writes_and_lists_three_pngs(tmp_path, capsys):
    out = tmp_path / "figures"
    argv = ["plot-priors", "--out", str(out), "--length", "24", "--heads", "2", "--head", "1"]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out.split()
    names = ["prior_curves.png", "goat_decomposition.png", "heatmaps.png"]
    assert printed == [str(out / name) for name in names]
    assert all((out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for name in names)


def test_unknown_subcommand_exits_nonzero(capsys):
    assert exit_code(["frobnicate"]) != 0
    assert "invalid choice: 'frobnicate'" in capsys.readouterr().err


def test_missing_subcommand_exits_nonzero(capsys):
    assert exit_code([]) != 0
    assert "required" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--length", "1"], "argument --length: must be an integer >= 2, got 1"),
        (["--length", "ten"], "argument --length: expected an integer, got 'ten'"),
        (["--heads", "0"], "argument --heads: must be an integer >= 1, got 0"),
        (["--heads", "2", "--head", "2"], "argument --head: must be < --heads (2), got 2"),
    ],
)
def test_bad_sizes_give_a_clear_error(tmp_path, capsys, args, message):
    assert exit_code(["plot-priors", "--out", str(tmp_path), *args]) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_version_is_printed(capsys):
    from priorattn import __version__

    assert exit_code(["--version"]) == 0
    assert capsys.readouterr().out == f"priorattn {__version__}\n"


def test_the_version_is_the_packages_and_the_changelog_has_it():
    import tomllib

    from priorattn import __version__

    root = Path(__file__).resolve().parents[1]
    declared = tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]
    assert __version__ == declared
    assert f"\n## {declared}\n" in (root / "CHANGELOG.md").read_text()
    done = subprocess.run([sys.executable, "-m", "priorattn", "--version"], capture_output=True, text=True)
    assert done.stdout == f"priorattn {declared}\n"


def test_plot_priors_into_a_file_is_a_one_line_error(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("")
    assert exit_code(["plot-priors", "--out", str(afile)]) == 2
    assert f"error: the output directory {afile} is a file\n" in capsys.readouterr().err


@pytest.mark.parametrize(
    "message, expected",
    [
        ("give window=", "give --window"),
        ("give window= (a size)", "give --window (a size)"),
        (
            "batch_size=6 must be a multiple of grad_accum=4",
            "--batch-size=6 must be a multiple of --grad-accum=4",
        ),
        ("lr must be > 0, got -1", "--lr must be > 0, got -1"),
        ("warmup_steps must be an int", "--warmup must be an int"),
        ("pass resume=True to continue it", "pass --resume to continue it"),
        ("d_model=32 is not divisible by n_heads=3", "d_model=32 is not divisible by n_heads=3"),  # no flags
        ("the lr of 3 steps", "the lr of 3 steps"),  # a word, not an argument
        ("train.lr: run has 0.1", "train.lr: run has 0.1"),  # a config path stays
    ],
)
def test_library_argument_names_become_the_flags_of_the_command(message, expected):
    parser = argparse.ArgumentParser()
    for flag in ("--window", "--batch-size", "--grad-accum", "--lr", "--warmup"):
        parser.add_argument(flag)
    parser.add_argument("--resume", action="store_true")
    assert cli.flag_names(message, parser) == expected


@pytest.mark.parametrize(
    "argv",
    [
        ["analyze", "priors", "--run", "{missing}"],
        ["analyze", "attention", "--run", "{missing}", "--prompt", "hi", "--layer", "0", "--head", "0"],
        ["analyze", "sink-mass", "--run", "{missing}"],
        ["analyze", "identities", "--run", "{missing}"],
        ["hf-extend", "--model", "{missing}", "--prior", "ggd", "--seq-len", "64", "--steps", "1"],
        ["dna", "--genome", "{missing}"],
    ],
)
def test_a_command_refused_for_a_missing_input_leaves_no_output_directory(tmp_path, capsys, argv):
    argv = [a.format(missing=tmp_path / "missing") for a in argv] + ["--out", str(tmp_path / "out")]
    assert exit_code(argv) == 2
    assert "missing" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "argv, prog",
    [
        (["train", "--out", "{tmp}", "--steps", "0"], "priorattn train"),
        (["retrieval"], "priorattn retrieval"),
        (["eval", "ppl", "--run", "{tmp}", "--windows", "0"], "priorattn eval ppl"),
        (["no-such-command"], "priorattn"),
    ],
)
def test_an_error_is_one_line_and_a_pointer_to_help_not_the_whole_usage(tmp_path, capsys, argv, prog):
    with pytest.raises(SystemExit) as exited:
        cli.main([arg.format(tmp=tmp_path / "out") for arg in argv])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    error, pointer = err.splitlines()
    assert "usage:" not in err and error.startswith(f"{prog}: error: ")
    assert pointer == f"For more information, try '{prog} --help'."


@pytest.mark.parametrize("prior, flags", [("fox", "--attention fox"), ("rope", "--encoding rope")])
def test_train_given_a_mechanism_as_a_prior_names_the_flag_that_gives_it(tmp_path, capsys, prior, flags):
    assert exit_code(["train", "--prior", prior, "--out", str(tmp_path / "run")]) == 2
    error = capsys.readouterr().err
    assert f"unknown prior {prior!r}" in error and f"give {flags}" in error
    assert not (tmp_path / "run").exists()


def test_train_given_a_misspelt_prior_gets_no_mechanism_hint(tmp_path, capsys):
    assert exit_code(["train", "--prior", "gaot", "--out", str(tmp_path / "run")]) == 2
    error = capsys.readouterr().err
    assert "unknown prior 'gaot'" in error and "give --" not in error


@pytest.mark.parametrize(
    "given, named",
    [
        ("goat(slope=none)", ["goat_noslope"]),
        ("nope,goat(slope=none, sink=none),rope", ["nope", "goat_spectral", "rope"]),
        ("goat(sink=none)+ssmax,fox", ["goat_nosink+ssmax", "fox"]),
        ("ggd+ssmax", ["ggd+ssmax"]),
    ],
)
def test_compare_takes_prior_specs_that_name_its_mechanisms(given, named, tmp_path):
    args = cli.build_parser().parse_args(["compare", "--out", str(tmp_path), "--priors", given])
    assert args.models == named  # CompareConfig.models


def test_compare_given_a_spec_no_mechanism_names_says_how_to_train_it(tmp_path, capsys):
    assert exit_code(["compare", "--out", str(tmp_path / "c"), "--priors", "goat(num_freqs=3)"]) == 2
    error = capsys.readouterr().err
    assert "unknown mechanism 'goat(num_freqs=3)'" in error and "priorattn train --prior SPEC" in error
