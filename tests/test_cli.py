"""The command line: subcommands, their output, and clear errors for bad arguments."""

from __future__ import annotations

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
