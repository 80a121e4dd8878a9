"""``priorattn scalar-exp``, ``vision`` and ``dna``: the seeds' experiments that train a set of
models and measure them (scalar sort attention, ViTs at unseen resolutions, genomes). Their flags
are the fields of the studies' configs (:mod:`priorattn.cli.configs`), a field given on the command
line overriding what ``--budget`` makes of it."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from .configs import Flag, add_study_flags, budget_config, given
from .parsing import fail, int_at_least, int_list, name_list, positive_number

SEED = Flag(type=int_at_least(0))


def dna(args: argparse.Namespace) -> int:
    """Train nucleotide-level models that differ in positional mechanism on a genome; measure them."""
    from ..studies.dna import DNAConfig
    from ..studies.dna import dna as run

    try:
        config = budget_config(args, DNAConfig)
        results = run(config, args.out, progress=not args.quiet)
    except (ValueError, FileNotFoundError, FileExistsError) as e:  # no genome, bad FASTA, bad budget
        fail(args, e)
    for name, m in results["models"].items():
        r = "-" if m["gc_pearson"] is None else f"{m['gc_pearson']:.3f}"
        print(
            f"{name:<8} {m['bits_per_base']:.4f} bits/base  {m['tokens_per_s']:>8,.0f} bases/s  "
            f"{m['peak_rss_mb']:>6,.0f} MB peak  match {m['match_rate']:.3f}  GC r {r}"
        )
    print(f"unigram baseline {results['unigram_bits_per_base']:.4f} bits/base; results in {args.out}")
    return 0


def scalar_exp(args: argparse.Namespace) -> int:
    """Run one of seed 002's experiments; write DIR/results.json and its figures."""
    from ..studies.scalar import Settings, run_experiment

    options = given(args, Settings, skip={"budget"})
    try:
        results = run_experiment(args.number, args.out, args.budget, progress=not args.quiet, **options)
    except (ValueError, FileNotFoundError, FileExistsError) as e:  # other settings, a file as --out
        fail(args, e)
    figures = ", ".join(results["figures"])
    print(f"experiment {args.number}: {args.out / 'results.json'}; figures in {args.out}: {figures}")
    return 0


def vision(args: argparse.Namespace) -> int:
    """Train a ViT per 2D position mechanism on Fashion-MNIST, evaluate at larger resolutions."""
    from ..studies.vision.experiment import RESULTS_JSON, VisionConfig, run_vision

    try:
        config = budget_config(args, VisionConfig)
        summary = run_vision(config, args.out, args.data, progress=not args.quiet)
    except (ValueError, FileNotFoundError, FileExistsError) as e:  # no data, corrupt IDX, out a file
        fail(args, e)
    for name, result in summary["models"].items():
        cells = "  ".join(f"{size}px {acc:.3f}" for size, acc in result["accuracy"].items())
        print(f"{name:<8} {cells}")
    print(f"results in {args.out / RESULTS_JSON}")
    return 0


def add_dna_parser(commands) -> None:
    from ..models.named import mechanisms
    from ..models.presets import PRESETS
    from ..studies.dna.config import DNAConfig

    p = commands.add_parser(
        "dna",
        help="nucleotide-level language models on a bacterial genome: GOAT vs RoPE vs ALiBi",
        description=(
            "Train tiny byte-per-base models that differ only in positional mechanism on a genome "
            "(seed 000 Fig. 4; `make genomes` fetches them), hold out whole regions for validation, "
            "and write DIR/results.json and nll.png, efficiency.png, continuations.png: validation "
            "NLL and bits per base, training bases/s and peak memory, sampled 200-base continuations "
            "with their match rate and GC%% correlation. A re-run reuses finished models."
        ),
    )
    counts = ("seq_len", "steps", "batch_size", "continuations", "prompt_bases", "new_bases", "gc_window")
    flags = {name: Flag(type=int_at_least(1)) for name in counts}
    flags |= dict(
        models=Flag(type=name_list(list(mechanisms()), "model")),
        preset=Flag(choices=tuple(sorted(PRESETS))),
        temperature=Flag(type=positive_number),
        seed=SEED,
    )
    add_study_flags(p, DNAConfig, flags)
    p.set_defaults(func=dna, parser=p)


def add_scalar_exp_parser(commands) -> None:
    from ..studies.scalar import EXPERIMENTS
    from ..studies.scalar.common import Settings

    listing = "; ".join(f"{n}: {e.description}" for n, e in sorted(EXPERIMENTS.items()))
    p = commands.add_parser(
        "scalar-exp",
        help="run one of seed 002's proposed experiments (scalar sort attention)",
        description=(
            "Train the tiny models experiment N needs on the embedded corpus into DIR/runs (a "
            f"re-run reuses finished ones) and write DIR/results.json and figures. {listing}."
        ),
    )
    p.add_argument("number", type=int, choices=sorted(EXPERIMENTS), metavar="N", help="experiment number")
    # run_experiment takes the budget and the seed; the other settings are each experiment's
    fixed = {field.name for field in dataclasses.fields(Settings)} - {"seed"}
    add_study_flags(p, Settings, dict(seed=SEED), skip=fixed)
    p.set_defaults(func=scalar_exp, parser=p)


def add_vision_parser(commands) -> None:
    from ..studies.vision.data import DEFAULT_DATA
    from ..studies.vision.experiment import MODELS, VisionConfig

    p = commands.add_parser(
        "vision",
        help="ViTs with 2D GOAT, RoPE, ALiBi, learned positions: accuracy at unseen resolutions",
        description=(
            "Train one small ViT per 2D position mechanism on Fashion-MNIST at 28x28, evaluate each "
            "zero-shot on test images upsampled to 42, 56 and 84 pixels (seed 000 Fig. 5), and write "
            "DIR/results.json, DIR/accuracy.png and DIR/goat_prior.png (the learned 2D log-prior). "
            "goat_nosink, GOAT without its key sink, is an ablation trained when named."
        ),
    )
    p.add_argument(
        "--data",
        type=Path,
        default=DEFAULT_DATA,
        help="directory of the Fashion-MNIST IDX files, from `make fashion-mnist DATA=DIR` (%(default)s)",
    )
    flags = {
        name: Flag(type=int_at_least(1)) for name in ("train_images", "test_images", "steps", "batch_size")
    }
    flags |= dict(
        models=Flag(type=name_list(list(MODELS), "model")),
        lr=Flag(type=positive_number),
        resolutions=Flag(type=int_list),
        seed=SEED,
    )
    add_study_flags(p, VisionConfig, flags)
    p.set_defaults(func=vision, parser=p)
