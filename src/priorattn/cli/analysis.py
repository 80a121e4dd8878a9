"""``priorattn plot-priors`` and ``priorattn analyze ...``: draw the priors; look inside a trained
run (learned priors, sink mass, attention maps, seed 004's identities) and train seed 000's
copy-mixture probe."""

from __future__ import annotations

import argparse
from pathlib import Path

from .configs import Flag, add_config_flags, given
from .parsing import fail, float_list, index_list, int_at_least, positive_number


def plot_priors(args: argparse.Namespace) -> int:
    """Draw every prior's log-prior curves and heatmaps to PNG files; print their paths."""
    from ..files import prepare_out

    if args.head >= args.heads:
        args.parser.error(f"argument --head: must be < --heads ({args.heads}), got {args.head}")
    try:
        prepare_out(args.out)
    except FileExistsError as e:
        fail(args, e)
    from ..analysis.plots import plot_priors as draw  # matplotlib loads only when drawing

    for path in draw(args.out, args.length, args.heads, args.head):
        print(path)
    return 0


def analyze_identities(args: argparse.Namespace) -> int:
    """Check seed 004's policy-gradient identities on a run's attention; print and save the residuals."""
    from ..analysis.identities import check_run
    from ..eval.jobs import RESULTS_JSON, prepare_out
    from ..files import write_json_atomic

    options = dict(layers=args.layers, heads=args.heads, rows=args.rows, sequences=args.sequences)
    try:
        result = check_run(args.run, length=args.length, seed=args.seed, **options)
        out = prepare_out(args.out)
    except (ValueError, FileNotFoundError, FileExistsError) as e:  # no run, no checkpoint, bad index
        args.parser.error(str(e))
    write_json_atomic(out / RESULTS_JSON, result)
    print(f"{'identity':<22} {'residual':>9} {'max |rhs|':>9} {'min p':>9}   statement")
    for name, residual in result["residuals"].items():
        numbers = (residual[key] for key in ("relative", "scale", "smallest_weight"))
        print(f"{name:<22} {' '.join(f'{x:9.2e}' for x in numbers)}   {result['identities'][name]}")
    print(
        "residual: max |lhs - rhs| / max |rhs| in float64, min p: the smallest weight it was checked on;"
        f" results in {out / RESULTS_JSON}"
    )
    return 0


def analyze_copy_mixture(args: argparse.Namespace) -> int:
    """Train on seed 000's copy-mixture task, draw the learned GOAT prior, write DIR/results.json."""
    from ..studies.copy_mixture import FIGURE, RESULTS_JSON, CopyMixtureConfig, copy_mixture_job

    try:
        config = CopyMixtureConfig(**given(args, CopyMixtureConfig))
        result = copy_mixture_job(config, args.out, head=args.head, progress=not args.quiet)
    except (ValueError, FileExistsError) as e:
        fail(args, e)
    print(
        f"sink_argmax {result['sink_argmax']} (first token: 0), relative_argmax_lag "
        f"{result['relative_argmax_lag']} (previous token: 1); eval loss {result['eval_loss']:.4f} "
        f"nats, best possible {result['optimal_loss']:.4f}"
    )
    print(f"figure {args.out / FIGURE}, results in {args.out / RESULTS_JSON}")
    return 0


def analyze_priors(args: argparse.Namespace) -> int:
    """Draw a run's learned priors (curves, heatmaps, GOAT's sink) with the numbers in results.json."""
    from ..analysis.views import RESULTS_JSON
    from ..analysis.views import analyze_priors as run

    options = dict(layers=args.layers, heads=args.heads, length=args.length, extrapolate=args.extrapolate)
    try:
        result = run(args.run, args.out, **options)
    except (ValueError, FileNotFoundError, FileExistsError) as e:  # no run, no checkpoint, bad index
        fail(args, e)
    for layer in result["layers"]:
        for head in layer["heads"]:
            params = ", ".join(f"{k} {v:.4g}" for k, v in head.items() if k != "head" and v is not None)
            print(f"layer {layer['layer']} head {head['head']}: {params or 'no learned parameters'}")
    print(f"figures and {RESULTS_JSON} in {args.out}")
    return 0


def analyze_sink_mass(args: argparse.Namespace) -> int:
    """Attention mass on key 0 against the content's dynamic range, one curve per run."""
    from ..analysis.views import OMEGAS, RESULTS_JSON
    from ..analysis.views import analyze_sink_mass as run

    omegas = args.omegas or OMEGAS
    options = dict(length=args.length, omegas=omegas, samples=args.samples, seed=args.seed)
    try:
        result = run(args.run, args.out, **options)
    except (ValueError, FileNotFoundError, FileExistsError) as e:  # no run, no checkpoint, bad omegas
        fail(args, e)
    width = max(len("omega"), *(len(entry["label"]) for entry in result["runs"]))
    print(f"{'omega':<{width}} " + " ".join(f"{o:>7g}" for o in result["omegas"]))
    for entry in result["runs"]:
        print(f"{entry['label']:<{width}} " + " ".join(f"{m:7.4f}" for m in entry["mean"]))
    print(f"mean mass on key 0 over layers, heads and queries; {RESULTS_JSON} in {args.out}")
    return 0


def analyze_attention(args: argparse.Namespace) -> int:
    """Draw one head's attention weights on a prompt, with the weights in results.json."""
    from ..analysis.views import RESULTS_JSON
    from ..analysis.views import analyze_attention as run

    try:
        result = run(args.run, args.out, prompt=args.prompt, layer=args.layer, head=args.head)
    except (ValueError, FileNotFoundError, FileExistsError) as e:  # no run, bad index, empty prompt
        fail(args, e)
    print(
        f"layer {result['layer']} head {result['head']}, {len(result['tokens'])} tokens: "
        f"attention.png and {RESULTS_JSON} in {args.out}"
    )
    return 0


def add_analyze_parser(commands) -> None:
    p = commands.add_parser(
        "analyze",
        help="look inside a trained run: priors, sink mass, attention maps, backward-pass identities",
        description="Analyses of a trained run directory.",
    )
    analyses = p.add_subparsers(title="analyses", dest="analysis", required=True)
    text = (
        "Check seed 004 Sec. 5-7 on the run's attention layers in float64: the score gradient in "
        "advantage form, the Fisher information, the Hessian of the log-sum-exp potential and the "
        "natural gradient; print each identity's largest relative residual and write DIR/results.json."
    )
    t = run_analysis_parser(analyses, "identities", "the policy-gradient identities of seed 004", text)
    add_layer_and_head_lists(t)
    t.add_argument(
        "--rows", type=int_at_least(1), default=8, help="query rows per layer and head (%(default)s)"
    )
    t.add_argument("--sequences", type=int_at_least(1), default=2, help="validation windows (%(default)s)")
    t.add_argument("--length", type=int_at_least(2), help="tokens per window (the training length)")
    t.add_argument("--seed", type=int_at_least(0), default=0, help="(%(default)s)")
    t.set_defaults(func=analyze_identities, parser=t)
    add_copy_mixture_parser(analyses)
    add_analyze_priors_parser(analyses)
    add_analyze_sink_mass_parser(analyses)
    add_analyze_attention_parser(analyses)


def run_analysis_parser(analyses, name: str, help: str, description: str) -> argparse.ArgumentParser:
    """The parser of ``analyze NAME``, with the ``--run`` it reads and the ``--out`` it writes."""
    t = analyses.add_parser(name, help=help, description=description)
    t.add_argument("--run", type=Path, required=True, help="a run directory of priorattn train")
    t.add_argument("--out", type=Path, required=True, help="output directory")
    return t


def add_layer_and_head_lists(t: argparse.ArgumentParser) -> None:
    t.add_argument("--layers", type=index_list, help="comma-separated layer indices (all)")
    t.add_argument("--heads", type=index_list, help="comma-separated head indices (all)")


def add_analyze_priors_parser(analyses) -> None:
    text = (
        "Draw the learned prior of each layer and head of a run: curves over the keys behind the last "
        "query (BAM's learned shape beta in the legend), heatmaps before and after the causal mask, "
        "and GOAT's sink u(j) far past the training length; write the PNGs and DIR/results.json."
    )
    t = run_analysis_parser(analyses, "priors", "the learned priors of a run, drawn", text)
    add_layer_and_head_lists(t)
    t.add_argument(
        "--length", type=int_at_least(2), help="positions of curves and heatmaps (training length)"
    )
    t.add_argument(
        "--extrapolate",
        type=int_at_least(1),
        default=16,
        help="draw the sink to this many training lengths (%(default)s)",
    )
    t.set_defaults(func=analyze_priors, parser=t)


def add_analyze_sink_mass_parser(analyses) -> None:
    from ..analysis.views import OMEGAS

    text = (
        "Attention mass on key 0 as the content's dynamic range omega grows (seed 000 Thm. 5.1, Fig. "
        "2c): random content scores of range omega on every query row plus the run's learned "
        "log-prior, averaged over layers, heads and queries; one curve per run in DIR/sink_mass.png."
    )
    t = analyses.add_parser("sink-mass", help="signal strength against sink mass", description=text)
    t.add_argument(
        "--run",
        type=Path,
        action="append",
        required=True,
        help="a run directory, or a compare output (each of its models); repeat for several",
    )
    t.add_argument("--out", type=Path, required=True, help="output directory")
    t.add_argument("--length", type=int_at_least(2), help="query positions (each run's training length)")
    omegas = t.add_argument(
        "--omegas", type=float_list, help="comma-separated dynamic ranges (%(shown_default)s)"
    )
    omegas.shown_default = f"{OMEGAS[0]:g},{OMEGAS[1]:g},...,{OMEGAS[-1]:g}"
    t.add_argument(
        "--samples", type=int_at_least(1), default=8, help="random draws of the content (%(default)s)"
    )
    t.add_argument("--seed", type=int_at_least(0), default=0, help="(%(default)s)")
    t.set_defaults(func=analyze_sink_mass, parser=t)


def add_analyze_attention_parser(analyses) -> None:
    text = (
        "Draw the attention weights of one head of a run's model on a prompt (the layer's own map, "
        "float64, reference route); write DIR/attention.png and DIR/results.json with the weights."
    )
    t = run_analysis_parser(analyses, "attention", "one head's attention weights on a prompt", text)
    t.add_argument("--prompt", required=True, help="text to attend over")
    t.add_argument("--layer", type=int_at_least(0), required=True, help="layer index")
    t.add_argument("--head", type=int_at_least(0), required=True, help="head index")
    t.set_defaults(func=analyze_attention, parser=t)


def add_copy_mixture_parser(analyses) -> None:
    from ..studies.copy_mixture import MODELS, CopyMixtureConfig

    text = (
        "Train a one-layer causal model with a GOAT prior on seed 000's copy-mixture task (each token "
        "copies the first token, copies the previous one, or is noise), draw the learned prior as "
        "seed 000 Fig. 1 (sink, relative part, total, causal probabilities) and write "
        "DIR/results.json with the sink's peak key and the relative part's peak lag."
    )
    t = analyses.add_parser(
        "copy-mixture", help="the learned GOAT prior of seed 000 Fig. 1", description=text
    )
    t.add_argument("--out", type=Path, required=True, help="output directory")
    flags = {name: Flag(type=int_at_least(1)) for name in ("steps", "batch_size", "d_model", "heads")}
    flags |= {name: Flag(type=int_at_least(1)) for name in ("eval_sequences", "goat_freqs")}
    flags |= dict(
        vocab_size=Flag(type=int_at_least(2)),
        length=Flag(type=int_at_least(2)),
        weights=Flag(type=float_list),
        model=Flag(choices=MODELS),
        lr=Flag(type=positive_number),
        prior_lr=Flag(type=positive_number),
        seed=Flag(type=int_at_least(0)),
    )
    add_config_flags({"": t}, CopyMixtureConfig, "", flags)
    t.add_argument(
        "--head", type=int_at_least(0), default=0, help="head drawn and reported at the top (%(default)s)"
    )
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.set_defaults(func=analyze_copy_mixture, parser=t)


def add_plot_priors_parser(commands) -> None:
    plot = commands.add_parser(
        "plot-priors",
        help="draw every prior's log-prior curves and heatmaps to PNG files",
        description="Draw prior_curves.png, goat_decomposition.png and heatmaps.png into --out.",
    )
    plot.add_argument("--out", type=Path, required=True, help="directory for the PNGs (created)")
    plot.add_argument("--length", type=int_at_least(2), default=512, help="positions L (%(default)s)")
    plot.add_argument("--heads", type=int_at_least(1), default=8, help="heads per prior (%(default)s)")
    plot.add_argument("--head", type=int_at_least(0), default=0, help="head to draw (%(default)s)")
    plot.set_defaults(func=plot_priors, parser=plot)
