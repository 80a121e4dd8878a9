"""The ``priorattn`` command line: one subcommand per job, each a small function of parsed args."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn


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


def number(text: str) -> float:
    """An argparse ``type`` accepting finite numbers."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not abs(value) < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def positive_number(text: str) -> float:
    """An argparse ``type`` accepting finite numbers ``> 0``."""
    value = number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def non_negative_number(text: str) -> float:
    """An argparse ``type`` accepting finite numbers ``>= 0``."""
    value = number(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text}")
    return value


def name_list(choices, kind: str) -> Callable[[str], list[str]]:
    """An argparse ``type`` for comma-separated names, each one of ``choices``."""

    def parse(text: str) -> list[str]:
        names = [part.strip() for part in text.split(",")]
        unknown = [name for name in names if name not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {kind} {unknown[0]!r}: use {','.join(choices)}")
        return names

    return parse


def prior_specs() -> str:
    """The registered priors, for a --prior help."""
    from .priors import names

    return (
        f"{', '.join(names())}, with options as goat(num_freqs=4, slope=false), or a sum such as alibi+goat"
    )


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are the one-line error and a line pointing to ``--help``
    (as cargo's), not the whole usage first; subcommands' parsers are made of this class too."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\nFor more information, try '{self.prog} --help'.\n")


def fail(args: argparse.Namespace, error: Exception) -> NoReturn:
    """Exit with ``error`` as one usage line of the subcommand, with the library's argument names
    written as the flags a user types (see :func:`flag_names`)."""
    args.parser.error(flag_names(str(error), args.parser))


# Library arguments whose flag has another name.
FLAG_ALIASES = {"warmup_steps": "warmup"}


def flag_names(message: str, parser: argparse.ArgumentParser) -> str:
    """``message`` with each argument name of ``parser``'s flags, where the library names an
    argument (``window=1``, ``lr must ...``), written as the flag: ``--window=1``, ``--lr must``;
    a bare ``window=`` becomes ``--window`` and ``greedy=True`` of a switch ``--greedy``."""
    flags = {action.dest: action for action in parser._actions if action.option_strings}
    flags |= {name: flags[dest] for name, dest in FLAG_ALIASES.items() if dest in flags}
    names = "|".join(sorted(map(re.escape, flags), key=len, reverse=True))
    pattern = re.compile(rf"(?<![\w.'-])({names})(=True\b|=|(?= must\b))")

    def flag(match: re.Match) -> str:
        action = flags[match[1]]
        bare = match[2] == "=" and match.string[match.end() :][:1] in ("", " ", ")", ",", ";")
        if bare or (match[2] == "=True" and action.nargs == 0):
            return action.option_strings[-1]
        return action.option_strings[-1] + match[2]

    return pattern.sub(flag, message)


def normalizer_spec(text: str) -> str | float:
    """An argparse ``type`` for ``--normalizer``: a name, or a number read as an entmax alpha."""
    try:
        return float(text)
    except ValueError:
        return text


def plot_priors(args: argparse.Namespace) -> int:
    """Draw every prior's log-prior curves and heatmaps to PNG files; print their paths."""
    from .files import prepare_out

    if args.head >= args.heads:
        args.parser.error(f"argument --head: must be < --heads ({args.heads}), got {args.head}")
    try:
        prepare_out(args.out)
    except FileExistsError as e:
        fail(args, e)
    from .analysis.plots import plot_priors as draw  # matplotlib loads only when drawing

    for path in draw(args.out, args.length, args.heads, args.head):
        print(path)
    return 0


def train(args: argparse.Namespace) -> int:
    """Train a GPT on the default corpus or ``--data``; the run goes to ``--out``."""
    from .train import train as run

    try:
        model_config, config = train_configs(args)
        result = run(model_config, config, args.out, resume=args.resume, progress=not args.quiet)
    except (ValueError, FileNotFoundError, FileExistsError) as e:  # bad flags, data, run dir or checkpoint
        fail(args, e)
    if os.environ.get("RANK", "0") != "0":  # under torchrun, one report
        return 0
    print(
        f"step {result.step}: train loss {result.train_loss:.4f}, val loss {result.val_loss:.4f} "
        f"(unigram baseline {result.unigram_loss:.4f}) nats/token, {result.tokens_per_s:,.0f} tokens/s; "
        f"run in {result.run_dir}"
    )
    return 0


def train_configs(args: argparse.Namespace):
    """``(GPTConfig, TrainConfig)`` from the train flags. With ``--resume`` on a run, flags not
    given keep the run's values (the training loop checks the given ones against the run); with
    ``--init-from``, the model and data are that run's; else the model is ``--preset``'s."""
    from .data import vocab_size_of
    from .files import read_json
    from .models import GPTConfig, preset
    from .train import TrainConfig
    from .train.runs import CONFIG_JSON

    model_flags = dict(
        prior=args.prior,
        encoding=args.encoding,
        window=args.window,
        rope_interpolation=args.rope_interpolation,
        backend=args.backend,
        normalizer=args.normalizer,
        ssmax=args.ssmax or None,
        shared_prior=args.shared_prior or None,
        token_shift=args.token_shift or None,
        attention=args.attention,
        scalar_heads=args.scalar_heads,
        scalar_groups=args.scalar_groups,
        scalar_tau=args.tau,
        scalar_tau_init=args.tau_init,
        scalar_tau_cap=args.tau_cap,
        scalar_sink=args.scalar_sink or None,
        scalar_tau_length_scaling=args.tau_length_scaling,
    )
    model_flags = {name: value for name, value in model_flags.items() if value is not None}
    train_flags = {name: getattr(args, name) for name in TRAIN_FLAGS} | dict(
        warmup_steps=args.warmup,
        bf16=args.bf16 or None,
        compile=args.compile or None,
        init_from=None if args.init_from is None else str(args.init_from),
    )
    train_flags = {name: value for name, value in train_flags.items() if value is not None}
    if train_flags.get("grad_clip") == 0:
        train_flags["grad_clip"] = None
    if args.reg_spread_range is not None:  # "adaptive" is the config's None, so it is set here
        adaptive = args.reg_spread_range == "adaptive"
        train_flags["reg_spread_range"] = None if adaptive else args.reg_spread_range
    saved_path = args.out / CONFIG_JSON
    if args.resume and saved_path.is_file():  # what is not given is the run's
        saved = read_json(saved_path)
        config = TrainConfig.from_dict(saved["train"] | train_flags)
        if args.preset is None:
            return GPTConfig.from_dict(saved["model"] | model_flags), config
    elif args.init_from is not None:  # context extension: the model is the earlier run's
        interpolation = model_flags.pop("rope_interpolation", None)
        if model_flags or args.preset is not None:
            names = ", ".join(f"--{name.replace('_', '-')}" for name in model_flags) or "--preset"
            raise ValueError(
                f"{names} cannot be combined with --init-from (the model is that run's; "
                "only --rope-interpolation may change)"
            )
        earlier = read_json(args.init_from / CONFIG_JSON)
        if interpolation is not None:  # position interpolation for the longer context
            earlier["model"]["rope_interpolation"] = interpolation
        earlier_config = TrainConfig.from_dict(earlier["train"])
        for name in ("data", "text_encoding", "tokenizer", "vocab_size", "val_fraction"):  # the same data
            train_flags.setdefault(name, getattr(earlier_config, name))
        return GPTConfig.from_dict(earlier["model"]), TrainConfig(**train_flags)
    else:
        config = TrainConfig(**train_flags)
    model_flags["vocab_size"] = vocab_size_of(config.tokenizer, config.vocab_size)
    if config.seq_len is not None:
        model_flags["seq_len"] = config.seq_len
    return preset(args.preset or "tiny", **model_flags), config


# Train flags named as the TrainConfig fields they set.
TRAIN_FLAGS = (
    "data",
    "text_encoding",
    "tokenizer",
    "vocab_size",
    "val_fraction",
    "seq_len",
    "retrieval_mix",
    "positions",
    "steps",
    "batch_size",
    "grad_accum",
    "optimizer",
    "lr",
    "prior_lr",
    "weight_decay",
    "grad_clip",
    "seed",
    "log_every",
    "eval_every",
    "eval_sequences",
    "save_every",
    "keep_checkpoints",
    "reg_align",
    "reg_spread",
    "reg_tau",
    "reg_align_start",
    "reg_spread_start",
    "reg_tau_start",
)


def sample(args: argparse.Namespace) -> int:
    """Continue ``--prompt`` with the model a run trained; print the prompt and the continuation."""
    import torch

    from .scalar import SortedDecoding
    from .scalar.model import add_inference_length_rule
    from .train import load_run

    try:
        run = load_run(args.run)
        if args.tau_length_scaling:
            add_inference_length_rule(run.model, run.model_config.seq_len)
        prompt = torch.tensor([run.tokenizer.encode(args.prompt)])
        if prompt.shape[1] == 0:
            raise ValueError("argument --prompt: give at least one character")
        tokens = run.model.generate(
            prompt,
            args.tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            greedy=args.greedy,
            generator=torch.Generator().manual_seed(args.seed),
            sorted_decoding=None if args.sorted_window is None else SortedDecoding(args.sorted_window),
        )
    except (ValueError, FileNotFoundError) as e:  # no run there, an empty prompt, a bad temperature
        fail(args, e)
    print(run.tokenizer.decode(tokens[0].tolist()))
    return 0


def plot_runs(args: argparse.Namespace) -> int:
    """Draw the training curves of ``RUN_DIR``s into one PNG; print its path."""
    from .analysis.runs import plot_runs as draw

    try:
        print(draw(args.runs, args.out))
    except (ValueError, FileNotFoundError) as e:  # no metrics, a damaged config.json
        fail(args, e)
    return 0


def spread_range(text: str) -> tuple[float, float] | str:
    """An argparse ``type`` for ``--reg-spread-range``: ``"A,B"`` with ``A < B``, or ``"adaptive"``."""
    if text == "adaptive":
        return text
    try:
        low, high = (float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected A,B or 'adaptive', got {text!r}") from None
    if not low < high:
        raise argparse.ArgumentTypeError(f"expected A < B, got {text!r}")
    return low, high


def ints_at_least(low: int) -> Callable[[str], list[int]]:
    """An argparse ``type`` for comma-separated integers ``>= low``: ``"256,512,1024"``."""
    parse = int_at_least(low)

    def parse_list(text: str) -> list[int]:
        return [parse(part.strip()) for part in text.split(",")]

    return parse_list


int_list = ints_at_least(1)
seed_list = ints_at_least(0)


def evaluate(args: argparse.Namespace) -> int:
    """``priorattn eval {ppl,passkey,niah}``: score a run, write results.json and plots to --out."""
    from . import eval as evaluations

    out = args.out or args.run / "eval" / args.task
    options = dict(data=args.data, text_encoding=args.text_encoding, lengths=args.lengths, seed=args.seed)
    options["progress"] = not args.quiet
    if args.task == "ppl":
        job, options = evaluations.ppl_job, options | dict(windows=args.windows)
        options["tau_length_scaling"] = args.tau_length_scaling
    elif args.task == "passkey":
        job, options = evaluations.passkey_job, options | dict(depths=args.depths, trials=args.trials)
        options["digits"] = args.digits
    else:
        job, options = evaluations.niah_job, options | dict(depths=args.depths, trials=args.trials)
        options["variants"] = args.variants
    try:
        job(args.run, out, **options)
    except (ValueError, FileNotFoundError, FileExistsError) as e:  # no run, bad data, lengths, out
        fail(args, e)
    print(f"{args.task}: results in {out}")
    return 0


def compare(args: argparse.Namespace) -> int:
    """Train every positional mechanism alike, evaluate them all, write DIR/report.html."""
    from dataclasses import replace

    from .studies.compare.study import CompareConfig
    from .studies.compare.study import compare as run

    try:
        config = CompareConfig.for_budget(args.budget, args.priors, args.retrieval_mechanisms)
        if args.no_retrieval:
            config = replace(config, retrieval=None)
        config = replace(config, data=args.data, text_encoding=args.text_encoding)
        run(config, args.out, progress=not args.quiet)
    except (ValueError, FileNotFoundError, FileExistsError) as e:
        fail(args, e)
    print(f"report: {args.out / 'report.html'}")
    return 0


def retrieval(args: argparse.Namespace) -> int:
    """Train tiny models on synthetic retrieval per mechanism and seed; score them far beyond T."""
    from .studies.retrieval.report import run_retrieval_study
    from .studies.retrieval.study import RetrievalStudyConfig

    fields = dict(
        mechanisms=args.mechanisms,
        seeds=args.seeds,
        tasks=args.tasks,
        train_len=args.train_len,
        token_shift=args.token_shift,
    )
    try:
        config = RetrievalStudyConfig.for_budget(
            args.budget, **{k: v for k, v in fields.items() if v is not None}
        )
        run_retrieval_study(config, args.out, workers=args.workers, progress=not args.quiet)
    except (ValueError, FileNotFoundError, FileExistsError) as e:
        fail(args, e)
    print(f"report: {args.out / 'report.html'}")
    return 0


def dna(args: argparse.Namespace) -> int:
    """Train nucleotide-level models that differ in positional mechanism on a genome; measure them."""
    from .studies.dna import DNAConfig
    from .studies.dna import dna as run

    try:
        config = DNAConfig.for_budget(args.budget, args.models, genome=args.genome, seed=args.seed)
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
    from .studies.scalar import run_experiment

    try:
        results = run_experiment(args.number, args.out, args.budget, seed=args.seed, progress=not args.quiet)
    except (ValueError, FileNotFoundError, FileExistsError) as e:  # other settings, a file as --out
        fail(args, e)
    figures = ", ".join(results["figures"])
    print(f"experiment {args.number}: {args.out / 'results.json'}; figures in {args.out}: {figures}")
    return 0


def analyze_identities(args: argparse.Namespace) -> int:
    """Check seed 004's policy-gradient identities on a run's attention; print and save the residuals."""
    from .analysis.identities import check_run
    from .eval.jobs import RESULTS_JSON, prepare_out
    from .files import write_json_atomic

    options = dict(layers=args.layers, heads=args.heads, rows=args.rows, sequences=args.sequences)
    try:
        result = check_run(args.run, length=args.length, seed=args.seed, **options)
        out = prepare_out(args.out)
    except (ValueError, FileNotFoundError, FileExistsError) as e:  # no run, no checkpoint, bad index
        args.parser.error(str(e))
    write_json_atomic(out / RESULTS_JSON, result)
    for name, residual in result["residuals"].items():
        print(f"{name:<22} {residual:.3e}   {result['identities'][name]}")
    print(f"max |lhs - rhs| / max |rhs| in float64; results in {out / RESULTS_JSON}")
    return 0


def analyze_copy_mixture(args: argparse.Namespace) -> int:
    """Train on seed 000's copy-mixture task, draw the learned GOAT prior, write DIR/results.json."""
    from .studies.copy_mixture import FIGURE, RESULTS_JSON, CopyMixtureConfig, copy_mixture_job

    options = ("vocab_size", "weights", "length", "model", "d_model", "heads", "steps", "batch_size", "seed")
    try:
        config = CopyMixtureConfig(**{name: getattr(args, name) for name in options})
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
    from .analysis.views import RESULTS_JSON
    from .analysis.views import analyze_priors as run

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
    from .analysis.views import OMEGAS, RESULTS_JSON
    from .analysis.views import analyze_sink_mass as run

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
    from .analysis.views import RESULTS_JSON
    from .analysis.views import analyze_attention as run

    try:
        result = run(args.run, args.out, prompt=args.prompt, layer=args.layer, head=args.head)
    except (ValueError, FileNotFoundError, FileExistsError) as e:  # no run, bad index, empty prompt
        fail(args, e)
    print(
        f"layer {result['layer']} head {result['head']}, {len(result['tokens'])} tokens: "
        f"attention.png and {RESULTS_JSON} in {args.out}"
    )
    return 0


def hf_extend(args: argparse.Namespace) -> int:
    """Fine-tune a local transformers model with a prior at a longer length; save_pretrained to --out."""
    try:
        from .hf.extend import extend
        from .train import TrainConfig

        options = dict(steps=args.steps, batch_size=args.batch_size, lr=args.lr, prior_lr=args.prior_lr)
        options |= dict(warmup_steps=args.warmup, eval_sequences=args.eval_sequences, seed=args.seed)
        config = TrainConfig(data=args.data, seq_len=args.seq_len, **options)
        result = extend(
            args.model,
            args.out,
            config,
            prior=args.prior,
            remove_rope=args.remove_rope,
            progress=not args.quiet,
            shared_prior=args.shared_prior,
            prior_init=args.prior_init,
        )
    except (ValueError, FileNotFoundError, FileExistsError, ModuleNotFoundError) as e:
        fail(args, e)
    print(
        f"val loss at {result['seq_len']}: {result['val_loss_before']:.4f} before, "
        f"{result['val_loss_after']:.4f} after {result['steps']} steps "
        f"({result['seconds_per_step']:.2f} s/step); "
        f"model in {args.out} (priorattn.hf.from_pretrained)"
    )
    return 0


def float_list(text: str) -> list[float]:
    """An argparse ``type`` for comma-separated finite numbers ``>= 0``: ``"0,1,4"``."""
    return [non_negative_number(part.strip()) for part in text.split(",")]


def vision(args: argparse.Namespace) -> int:
    """Train a ViT per 2D position mechanism on Fashion-MNIST, evaluate at larger resolutions."""
    from .studies.vision.experiment import RESULTS_JSON, VisionConfig, run_vision

    try:
        config = VisionConfig.for_budget(args.budget, args.models, seed=args.seed)
        summary = run_vision(config, args.out, args.data, progress=not args.quiet)
    except (ValueError, FileNotFoundError, FileExistsError) as e:  # no data, corrupt IDX, out a file
        fail(args, e)
    for name, result in summary["models"].items():
        cells = "  ".join(f"{size}px {acc:.3f}" for size, acc in result["accuracy"].items())
        print(f"{name:<8} {cells}")
    print(f"results in {args.out / RESULTS_JSON}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = Parser(
        prog="priorattn", description="Attention priors for PyTorch: look at them, train with them."
    )
    parser.add_argument("--version", action="version", version=f"priorattn {__version__}")
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
    plot.set_defaults(func=plot_priors, parser=plot)

    add_train_parser(commands)

    gen = commands.add_parser(
        "sample",
        help="continue a prompt with the model a run trained",
        description="Load RUN's checkpoint and tokenizer and continue --prompt (KV-cached decoding).",
    )
    gen.add_argument("--run", type=Path, required=True, help="a run directory of priorattn train")
    gen.add_argument("--prompt", default="ROMEO.\n", help="text to continue (ROMEO.\\n)")
    gen.add_argument("--tokens", type=int_at_least(0), default=200, help="new tokens (200)")
    gen.add_argument("--temperature", type=float, default=0.8, help="(0.8)")
    gen.add_argument("--top-k", type=int_at_least(1), help="sample among the k likeliest tokens")
    gen.add_argument("--greedy", action="store_true", help="always the likeliest token")
    gen.add_argument("--seed", type=int, default=0, help="sampling seed (0)")
    gen.add_argument(
        "--sorted-window",
        type=int_at_least(1),
        metavar="K",
        help="scalar heads decode through a cache sorted by scalar key, attending over the K keys "
        "nearest each query (seed 002; scalar, hybrid and mixed runs)",
    )
    gen.add_argument(
        "--tau-length-scaling",
        action="store_true",
        help="scalar heads: a query seeing n > T keys uses tau (T / n)^2 (docs/scalar_decoding.md)",
    )
    gen.set_defaults(func=sample, parser=gen)

    add_eval_parser(commands)
    add_compare_parser(commands)
    add_retrieval_parser(commands)
    add_dna_parser(commands)
    add_scalar_exp_parser(commands)
    add_analyze_parser(commands)
    add_vision_parser(commands)
    add_hf_extend_parser(commands)

    curves = commands.add_parser(
        "plot-runs",
        help="draw train and validation loss of runs against step",
        description="Draw the loss curves of every RUN_DIR (with the unigram baseline) into --out.",
    )
    curves.add_argument("runs", type=Path, nargs="+", metavar="RUN_DIR")
    curves.add_argument("--out", type=Path, required=True, help="PNG file to write")
    curves.set_defaults(func=plot_runs, parser=curves)
    return parser


def add_hf_extend_parser(commands) -> None:
    from .models.gpt import PRIOR_INITS
    from .train.config import TrainConfig

    defaults = TrainConfig()
    p = commands.add_parser(
        "hf-extend",
        help="extend a transformers model's context: add a prior and fine-tune at a longer length",
        description=(
            "Load a local transformers causal LM (a save_pretrained directory; a directory or .json file "
            "with only a config builds a small random model, for a demo; nothing downloads), add a prior "
            "to every attention layer, fine-tune the model at --seq-len on --data with packed documents, "
            "and write it to --out with save_pretrained (load it with priorattn.hf.from_pretrained). "
            "Needs pip install 'priorattn[hf]'; see docs/hf.md."
        ),
    )
    p.add_argument("--model", required=True, help="model directory or config.json (PATH_OR_CONFIG)")
    p.add_argument("--prior", default="ggd", help=f"{prior_specs()} (ggd)")
    p.add_argument("--prior-init", choices=PRIOR_INITS, default="uniform", help="(uniform)")
    p.add_argument("--shared-prior", action="store_true", help="one prior for all layers (one per layer)")
    p.add_argument("--remove-rope", action="store_true", help="drop the model's RoPE: NoPE + prior")
    p.add_argument("--seq-len", type=int_at_least(1), required=True, help="the longer training length")
    p.add_argument("--steps", type=int_at_least(1), default=100, help="optimizer steps (100)")
    p.add_argument("--data", help="text folder, glob, file or hf:PATH[:COLUMN] (embedded Shakespeare)")
    p.add_argument("--batch-size", type=int_at_least(1), default=4, help="sequences per step (4)")
    p.add_argument("--lr", type=positive_number, default=1e-4, help="peak learning rate (1e-4)")
    p.add_argument("--prior-lr", type=positive_number, default=1e-2, help="prior parameters' rate (1e-2)")
    p.add_argument("--warmup", type=int_at_least(0), default=10, help="warmup steps (10)")
    p.add_argument(
        "--eval-sequences",
        type=int_at_least(1),
        default=defaults.eval_sequences,
        help=f"validation windows before and after ({defaults.eval_sequences})",
    )
    p.add_argument("--seed", type=int_at_least(0), default=0, help="(0)")
    p.add_argument("--out", type=Path, required=True, help="output model directory")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=hf_extend, parser=p)


def add_eval_parser(commands) -> None:
    from .data.retrieval import NIAH_VARIANTS

    p = commands.add_parser(
        "eval",
        help="score a trained run beyond its training length: ppl, passkey or niah",
        description=(
            "Evaluate the model of a run directory at lengths from its training length T to 64 T; "
            "write results.json and PNG plots into --out (default RUN/eval/TASK)."
        ),
    )
    tasks = p.add_subparsers(title="evaluations", dest="task", required=True)
    helps = dict(
        ppl="perplexity per length, past the training length, by position, and paired with short context",
        passkey="passkey retrieval at 20 depths (seed 003 Sec. 3.1)",
        niah="RULER-style needle in a haystack, six variants",
    )
    for task, text in helps.items():
        t = tasks.add_parser(task, help=text, description=text)
        t.add_argument(
            "--run", type=Path, required=True, help="a run directory of priorattn train, or of hf-extend"
        )
        t.add_argument(
            "--data", help="text file, folder, glob or hf:PATH to score (the run's validation split)"
        )
        t.add_argument("--text-encoding", default="utf-8", help="how --data's text files are decoded (utf-8)")
        t.add_argument("--lengths", type=int_list, help="comma-separated lengths in tokens (T, 2T, ..., 64T)")
        t.add_argument("--out", type=Path, help="output directory (RUN/eval/TASK)")
        t.add_argument("--seed", type=int_at_least(0), default=0, help="(0)")
        t.add_argument("--quiet", action="store_true", help="no progress bar")
        if task == "ppl":
            t.add_argument("--windows", type=int_at_least(1), default=8, help="windows per length (8)")
            t.add_argument(
                "--tau-length-scaling",
                action="store_true",
                help="scalar heads: a query seeing n > T keys uses tau (T / n)^2 (docs/scalar_decoding.md)",
            )
        else:
            depths = 20 if task == "passkey" else 5
            t.add_argument("--depths", type=int_at_least(1), default=depths, help=f"needle depths ({depths})")
            t.add_argument("--trials", type=int_at_least(1), default=3, help="prompts per cell (3)")
        if task == "passkey":
            t.add_argument("--digits", type=int_at_least(1), default=5, help="passkey digits (5)")
        if task == "niah":
            t.add_argument(
                "--variants",
                type=name_list(NIAH_VARIANTS, "NIAH variant"),
                default=list(NIAH_VARIANTS),
                help="comma-separated (all)",
            )
        t.set_defaults(func=evaluate, parser=t)


def index_list(text: str) -> list[int]:
    """An argparse ``type`` for comma-separated indices ``>= 0``: ``"0,2"``."""
    parse = int_at_least(0)
    return [parse(part.strip()) for part in text.split(",")]


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
    t.add_argument("--rows", type=int_at_least(1), default=8, help="query rows per layer and head (8)")
    t.add_argument("--sequences", type=int_at_least(1), default=2, help="validation windows (2)")
    t.add_argument("--length", type=int_at_least(2), help="tokens per window (the training length)")
    t.add_argument("--seed", type=int_at_least(0), default=0, help="(0)")
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
        help="draw the sink to this many training lengths (16)",
    )
    t.set_defaults(func=analyze_priors, parser=t)


def add_analyze_sink_mass_parser(analyses) -> None:
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
    t.add_argument("--omegas", type=float_list, help="comma-separated dynamic ranges (0,0.25,...,64)")
    t.add_argument("--samples", type=int_at_least(1), default=8, help="random draws of the content (8)")
    t.add_argument("--seed", type=int_at_least(0), default=0, help="(0)")
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
    from .studies.copy_mixture import MODELS, CopyMixtureConfig

    default = CopyMixtureConfig()
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
    t.add_argument("--steps", type=int_at_least(1), default=default.steps, help=f"({default.steps})")
    t.add_argument("--seed", type=int_at_least(0), default=default.seed, help=f"({default.seed})")
    t.add_argument(
        "--model",
        choices=MODELS,
        default=default.model,
        help="probe: attention layer with a position-free query; gpt: the library's GPT, one block (probe)",
    )
    t.add_argument(
        "--vocab-size", type=int_at_least(2), default=default.vocab_size, help=f"({default.vocab_size})"
    )
    weights = ",".join(f"{w:g}" for w in default.weights)
    t.add_argument(
        "--weights",
        type=float_list,
        default=default.weights,
        help=f"probabilities of copying the first token, the previous token, noise ({weights})",
    )
    t.add_argument(
        "--length",
        type=int_at_least(2),
        default=default.length,
        help=f"tokens per sequence ({default.length})",
    )
    t.add_argument(
        "--batch-size", type=int_at_least(1), default=default.batch_size, help=f"({default.batch_size})"
    )
    t.add_argument("--d-model", type=int_at_least(1), default=default.d_model, help=f"({default.d_model})")
    t.add_argument("--heads", type=int_at_least(1), default=default.heads, help=f"({default.heads})")
    t.add_argument("--head", type=int_at_least(0), default=0, help="head drawn and reported at the top (0)")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.set_defaults(func=analyze_copy_mixture, parser=t)


def add_experiment_options(p: argparse.ArgumentParser, steps: int, seed_help: str | None = "(0)") -> None:
    """``--out``, ``--budget`` (scaling ``steps`` training steps), ``--seed`` (unless ``seed_help``
    is None) and ``--quiet``: what every command that trains and measures models takes."""
    p.add_argument("--out", type=Path, required=True, help="output directory")
    budget_help = f"training budget scale: 0.1 smoke run (1: {steps} steps)"
    p.add_argument("--budget", type=positive_number, default=1.0, help=budget_help)
    if seed_help is not None:
        p.add_argument("--seed", type=int_at_least(0), default=0, help=seed_help)
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def add_compare_parser(commands) -> None:
    from .models.positions import mechanisms
    from .studies.compare.study import DEFAULT_MODELS, CompareConfig
    from .studies.retrieval.study import ALL_MECHANISMS, DEFAULT_MECHANISMS

    p = commands.add_parser(
        "compare",
        help="train every positional mechanism alike, evaluate them, write an HTML report",
        description=(
            "Train tiny models that differ only in positional mechanism (NoPE, sinusoidal, RoPE, "
            "local RoPE, ALiBi, BAM, GOAT) on a corpus with a retrieval mix, evaluate perplexity "
            "beyond the training length T, passkey at T, and passkey and NIAH beyond T for the models "
            "that retrieve at T; write DIR/report.html and DIR/results.json. A re-run reuses finished "
            "models, and evaluations with unchanged settings of an unchanged checkpoint."
        ),
    )
    p.add_argument(
        "--priors",
        type=name_list(list(mechanisms()), "prior"),
        help=f"comma-separated mechanisms, e.g. {','.join(DEFAULT_MODELS)} (the default)",
    )
    p.add_argument("--data", help="text file, folder, glob or hf:PATH to train on (the embedded Shakespeare)")
    p.add_argument("--text-encoding", default="utf-8", help="how --data's text files are decoded (utf-8)")
    study = p.add_mutually_exclusive_group()
    study.add_argument(
        "--retrieval-mechanisms",
        type=name_list(list(ALL_MECHANISMS), "mechanism"),
        help=f"mechanisms of the synthetic retrieval study ({','.join(DEFAULT_MECHANISMS)})",
    )
    study.add_argument("--no-retrieval", action="store_true", help="skip the synthetic retrieval study")
    add_experiment_options(p, CompareConfig().steps, seed_help=None)
    p.set_defaults(func=compare, parser=p)


def add_retrieval_parser(commands) -> None:
    from .data.synthetic import SYNTHETIC_TASKS
    from .studies.retrieval.study import ALL_MECHANISMS, DEFAULT_MECHANISMS, RetrievalStudyConfig

    defaults = RetrievalStudyConfig()
    p = commands.add_parser(
        "retrieval",
        help="synthetic retrieval far beyond the training length, per positional mechanism",
        description=(
            "Train one tiny model per (mechanism, seed) on synthetic retrieval sequences (answers only in "
            "the loss, lengths up to T), score exact match at T to 64 T (512 T from --budget 2) on the "
            "same sequences for every model, and write DIR/report.html and DIR/results.json with "
            "intervals, heatmaps, the learned priors and the seeds' claims judged. A re-run reuses "
            "finished models and scores."
        ),
    )
    p.add_argument(
        "--mechanisms",
        type=name_list(list(ALL_MECHANISMS), "mechanism"),
        help=f"comma-separated positions, each optionally +ssmax ({','.join(DEFAULT_MECHANISMS)})",
    )
    p.add_argument(
        "--seeds", type=seed_list, help=f"comma-separated seeds ({','.join(map(str, defaults.seeds))})"
    )
    p.add_argument(
        "--tasks",
        type=name_list(list(SYNTHETIC_TASKS), "task"),
        help=f"tasks trained together and scored apart ({','.join(defaults.tasks)})",
    )
    p.add_argument("--train-len", type=int_at_least(1), help=f"training length T ({defaults.train_len})")
    shift = p.add_mutually_exclusive_group()
    shift.add_argument(
        "--token-shift",
        dest="token_shift",
        action="store_true",
        default=None,
        help="every position also sees its predecessor's embedding (the default)",
    )
    shift.add_argument(
        "--no-token-shift", dest="token_shift", action="store_false", help="train without the token shift"
    )
    p.add_argument(
        "--workers",
        type=int_at_least(1),
        help="processes training models side by side, one thread each (one per CPU core)",
    )
    add_experiment_options(p, defaults.steps, seed_help=None)
    p.set_defaults(func=retrieval, parser=p)


def add_dna_parser(commands) -> None:
    from .models.positions import mechanisms
    from .studies.dna.config import DEFAULT_GENOME, DEFAULT_MODELS, DNAConfig

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
    p.add_argument("--genome", default=DEFAULT_GENOME, help=f"a FASTA file or directory ({DEFAULT_GENOME})")
    p.add_argument(
        "--models",
        type=name_list(list(mechanisms()), "model"),
        help=f"comma-separated mechanisms, e.g. {','.join(DEFAULT_MODELS)} (the default)",
    )
    add_experiment_options(p, DNAConfig().steps)
    p.set_defaults(func=dna, parser=p)


def add_scalar_exp_parser(commands) -> None:
    from .studies.scalar import EXPERIMENTS
    from .studies.scalar.common import Settings

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
    add_experiment_options(p, Settings().steps, seed_help="weights, batches, windows: a replicate (0)")
    p.set_defaults(func=scalar_exp, parser=p)


def add_vision_parser(commands) -> None:
    from .studies.vision.data import DEFAULT_DATA
    from .studies.vision.experiment import DEFAULT_MODELS, MODELS, VisionConfig

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
        help=f"directory of the Fashion-MNIST IDX files, from `make fashion-mnist DATA=DIR` ({DEFAULT_DATA})",
    )
    p.add_argument(
        "--models",
        type=name_list(list(MODELS), "model"),
        help=f"comma-separated, of {','.join(MODELS)} ({','.join(DEFAULT_MODELS)})",
    )
    add_experiment_options(p, VisionConfig().steps, seed_help="training and test subsets, init, batches (0)")
    p.set_defaults(func=vision, parser=p)


def add_train_parser(commands) -> None:
    from .models.gpt import ENCODINGS
    from .models.presets import PRESETS
    from .train.config import OPTIMIZERS, POSITIONS, TOKENIZERS, TrainConfig

    defaults = TrainConfig()
    p = commands.add_parser(
        "train",
        help="train a GPT with any prior on the embedded corpus or your own text",
        description=(
            "Train a GPT. The run directory --out gets config.json, data.json, metrics.jsonl and the "
            "checkpoints; --resume continues it after a crash with the arguments it was started with. "
            "Under torchrun every process runs this same command (DDP)."
        ),
    )
    model = p.add_argument_group("model")
    model.add_argument("--preset", choices=sorted(PRESETS), help="model size (tiny)")
    model.add_argument("--prior", help=f"{prior_specs()} (the preset's)")
    model.add_argument("--encoding", choices=ENCODINGS, help="position encoding (the preset's: none)")
    model.add_argument("--window", type=int_at_least(1), help="sliding window (required by local_rope)")
    model.add_argument(
        "--rope-interpolation",
        type=positive_number,
        help="RoPE position interpolation: positions p -> p / S; with --init-from, new/old seq-len (1)",
    )
    model.add_argument("--ssmax", action="store_true", help="Scalable-Softmax in every layer")
    model.add_argument(
        "--shared-prior",
        action="store_true",
        help="one prior shared by all layers, as BAM's code (default: one per layer, seed 003 App. C)",
    )
    model.add_argument(
        "--token-shift",
        action="store_true",
        help="add W e_{t-1} to each token embedding e_t (RWKV's token shift; W starts at 0): "
        "induction in one attention hop (off)",
    )
    model.add_argument("--backend", help="attention route (auto)")
    model.add_argument(
        "--normalizer",
        type=normalizer_spec,
        help="attention map: softmax, sparsemax, entmax15 or an entmax alpha > 1 (softmax)",
    )
    from .mechanisms import mechanism_names
    from .scalar.temperature import TAU_KINDS

    scalar = p.add_argument_group("scalar attention (seed 002, docs/scalar.md)")
    scalar.add_argument("--attention", choices=mechanism_names(), help="head kind (standard)")
    scalar.add_argument("--scalar-heads", type=int_at_least(1), help="scalar heads of mixed layers (half)")
    scalar.add_argument("--scalar-groups", type=int_at_least(1), help="value groups of scalar heads (1 each)")
    scalar.add_argument("--tau", choices=TAU_KINDS, help="bandwidth: one, one per head, or per token (head)")
    scalar.add_argument("--tau-init", type=positive_number, help="starting bandwidth (0.1)")
    scalar.add_argument("--tau-cap", type=positive_number, help="largest bandwidth (none)")
    scalar.add_argument("--scalar-sink", action="store_true", help="a sink key at 0 with a learned value")
    scalar.add_argument(
        "--tau-length-scaling",
        type=int_at_least(1),
        metavar="T",
        help="a query seeing n > T keys uses tau (T / n)^2, in training and after; with T below "
        "--seq-len the model learns local attention (docs/scalar_experiments.md section 8) (none)",
    )
    for term in ("align", "spread", "tau"):
        scalar.add_argument(f"--reg-{term}", type=float, metavar="W", help=f"weight of L_{term} (0)")
        start = f"--reg-{term}-start"
        scalar.add_argument(start, type=int_at_least(0), metavar="STEP", help="its first step (0)")
    scalar.add_argument(
        "--reg-spread-range",
        type=spread_range,
        help="L_spread targets: A,B or 'adaptive' (mean +- 3 std) (-3,3)",
    )
    data = p.add_argument_group("data")
    data.add_argument("--data", help="text folder, glob, file or hf:PATH[:COLUMN] (embedded Shakespeare)")
    data.add_argument(
        "--text-encoding", help=f"how --data's text files are decoded ({defaults.text_encoding})"
    )
    data.add_argument("--tokenizer", choices=TOKENIZERS, help=f"({defaults.tokenizer})")
    data.add_argument("--vocab-size", type=int_at_least(257), help="BPE vocabulary to train (8192)")
    data.add_argument("--val-fraction", type=float, help=f"documents held out ({defaults.val_fraction})")
    data.add_argument("--seq-len", type=int_at_least(1), help="training length (the preset's)")
    data.add_argument(
        "--retrieval-mix",
        type=float,
        help="fraction of sequences replaced by synthetic passkey/needle samples (0)",
    )
    data.add_argument(
        "--positions",
        choices=POSITIONS,
        help="positions of packed windows: restart at each document, or count from the window's start "
        f"(runs saved before this option) ({defaults.positions})",
    )
    opt = p.add_argument_group("optimization")
    opt.add_argument("--steps", type=int_at_least(1), help=f"optimizer steps ({defaults.steps})")
    opt.add_argument("--batch-size", type=int_at_least(1), help=f"sequences per step ({defaults.batch_size})")
    opt.add_argument("--grad-accum", type=int_at_least(1), help="micro-steps per step (1)")
    opt.add_argument("--optimizer", choices=OPTIMIZERS, help=f"({defaults.optimizer})")
    opt.add_argument("--lr", type=float, help=f"peak learning rate ({defaults.lr})")
    opt.add_argument("--prior-lr", type=float, help="learning rate of prior/SSMax parameters (--lr)")
    opt.add_argument("--weight-decay", type=float, help=f"({defaults.weight_decay})")
    opt.add_argument("--warmup", type=int_at_least(0), help=f"warmup steps ({defaults.warmup_steps})")
    opt.add_argument(
        "--grad-clip", type=non_negative_number, help=f"max gradient norm, 0 for none ({defaults.grad_clip})"
    )
    opt.add_argument("--bf16", action="store_true", help="bfloat16 autocast")
    opt.add_argument(
        "--compile", action="store_true", help="train the model through torch.compile (first step compiles)"
    )
    opt.add_argument("--seed", type=int_at_least(0), help=f"({defaults.seed})")
    opt.add_argument("--init-from", type=Path, help="start from this run's weights (context extension)")
    run = p.add_argument_group("run")
    run.add_argument("--out", type=Path, required=True, help="run directory")
    run.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out with its arguments (those given must match; --steps may be raised)",
    )
    run.add_argument("--log-every", type=int_at_least(1), help=f"({defaults.log_every})")
    run.add_argument("--eval-every", type=int_at_least(0), help=f"0: only at the end ({defaults.eval_every})")
    run.add_argument("--eval-sequences", type=int_at_least(1), help=f"({defaults.eval_sequences})")
    run.add_argument("--save-every", type=int_at_least(0), help=f"0: only at the end ({defaults.save_every})")
    run.add_argument(
        "--keep-checkpoints",
        type=int_at_least(1),
        help=f"newest checkpoints kept; resume falls back to an older one ({defaults.keep_checkpoints})",
    )
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=train, parser=p)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
