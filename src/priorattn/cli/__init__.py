"""The ``priorattn`` command line: one subcommand per job, each a small function of parsed args.

One module per command group (:mod:`~priorattn.cli.train`, :mod:`~priorattn.cli.evaluation`,
:mod:`~priorattn.cli.analysis`, :mod:`~priorattn.cli.experiments`, :mod:`~priorattn.cli.hf`);
:mod:`~priorattn.cli.configs` derives a command's flags from the config dataclasses, and
:mod:`~priorattn.cli.parsing` holds what every parser shares (one-line errors, argument types).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Sequence

from ..train.checkpoint import CheckpointWarning, ResumeWarning
from . import analysis, evaluation, experiments, hf, train
from .parsing import Parser, flag_names

__all__ = ["build_parser", "flag_names", "main"]


def build_parser() -> Parser:
    from .. import __version__

    parser = Parser(
        prog="priorattn", description="Attention priors for PyTorch: look at them, train with them."
    )
    parser.add_argument("--version", action="version", version=f"priorattn {__version__}")
    commands = parser.add_subparsers(title="commands", dest="command", required=True)
    analysis.add_plot_priors_parser(commands)
    train.add_train_parser(commands)
    train.add_sample_parser(commands)
    train.add_export_parser(commands)
    evaluation.add_eval_parser(commands)
    evaluation.add_compare_parser(commands)
    evaluation.add_retrieval_parser(commands)
    experiments.add_dna_parser(commands)
    experiments.add_scalar_exp_parser(commands)
    analysis.add_analyze_parser(commands)
    experiments.add_vision_parser(commands)
    hf.add_hf_extend_parser(commands)
    train.add_plot_runs_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with warnings.catch_warnings():  # restores how warnings are shown when the command returns
        warnings.showwarning = run_warnings_in_one_line(warnings.showwarning)
        return args.func(args)


def run_warnings_in_one_line(show: Callable) -> Callable:
    """``show`` (:func:`warnings.showwarning`), except that what a run's checkpoints warn of is one
    line on stderr, ``priorattn: warning: ...`` (the warning's source line would say nothing): a
    :class:`~priorattn.train.checkpoint.CheckpointWarning` names the damaged checkpoint file and the
    checkpoint an evaluation then scores, ``compare`` evaluates or a resumed run continues from; a
    :class:`~priorattn.train.checkpoint.ResumeWarning` says why a resumed run leaves the losses of
    the run that saved it."""

    def shown(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, (CheckpointWarning, ResumeWarning)):
            print(f"priorattn: warning: {message}", file=sys.stderr if file is None else file, flush=True)
        else:
            show(message, category, filename, lineno, file, line)

    return shown
