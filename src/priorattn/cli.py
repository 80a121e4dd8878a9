"""The ``priorattn`` command line: one subcommand per job, each a small function of parsed args."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type`` accepting integers ``>= low``, with a message naming the bound."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {value}")
        return value

    return parse


def plot_priors(args: argparse.Namespace) -> int:
    """Draw every prior's log-prior curves and heatmaps to PNG files; print their paths."""
    if args.head >= args.heads:
        args.parser.error(f"argument --head: must be < --heads ({args.heads}), got {args.head}")
    from .analysis.plots import plot_priors as draw  # matplotlib loads only when drawing

    for path in draw(args.out, args.length, args.heads, args.head):
        print(path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="priorattn", description="Attention priors for PyTorch: look at them, train with them."
    )
    commands = parser.add_subparsers(title="commands", dest="command", required=True)

    plot = commands.add_parser(
        "plot-priors",
        help="draw every prior's log-prior curves and heatmaps to PNG files",
        description="Draw prior_curves.png, goat_decomposition.png and heatmaps.png into --out.",
    )
    plot.add_argument("--out", type=Path, required=True, help="directory for the PNGs (created)")
    plot.add_argument("--length", type=int_at_least(2), default=512, help="positions L (512)")
    plot.add_argument("--heads", type=int_at_least(1), default=8, help="heads per prior (8)")
    plot.add_argument("--head", type=int_at_least(0), default=0, help="head to draw (0)")
    plot.set_defaults(run=plot_priors, parser=plot)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)
