"""``priorattn train``, ``sample``, ``export`` and ``plot-runs``: train a GPT into a run directory,
continue a prompt with it, copy it with its checkpoint as one file, draw its loss curves. ``train``
has a flag for every field of ``GPTConfig`` and ``TrainConfig`` and of every registered
mechanism's options (``GPTConfig.attention_options``, :mod:`priorattn.cli.configs`);
:data:`MODEL_FLAGS`, :data:`OPTION_FLAGS` and :data:`TRAIN_FLAGS` write some of them their own way."""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

from ..data import KINDS as TOKENIZERS
from ..encodings import ENCODINGS, ROPE_SCALINGS
from ..mechanisms import mechanism_names, options_classes, takers
from ..models.gpt import GPTConfig
from ..models.presets import PRESETS
from ..scalar import ScalarOptions
from ..scalar.temperature import TAU_KINDS
from ..train.config import OPTIMIZERS, PARALLEL, POSITIONS, TrainConfig
from ..train.resume import DEFAULT_PRESET
from .configs import Flag, add_config_flags, given
from .parsing import fail, int_at_least, non_negative_number, positive_number, prior_specs

SCALAR = "scalar attention (seed 002, docs/scalar.md)"


def spread_range(text: str) -> tuple[float, float] | None:
    """An argparse ``type`` for ``--reg-spread-range``: ``"A,B"`` with ``A < B``, or ``"adaptive"``
    (the config's ``None``)."""
    if text == "adaptive":
        return None
    try:
        low, high = (float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected A,B or 'adaptive', got {text!r}") from None
    if not low < high:
        raise argparse.ArgumentTypeError(f"expected A < B, got {text!r}")
    return low, high


def grad_clip(text: str) -> float | None:
    """An argparse ``type`` for ``--grad-clip``: a number ``>= 0``, 0 for none (the config's ``None``)."""
    return non_negative_number(text) or None


MODEL_FLAGS = {
    "encoding": Flag(choices=tuple(ENCODINGS)),
    "window": Flag(type=int_at_least(1)),
    "rope_interpolation": Flag(type=positive_number),
    "rope_scaling": Flag(choices=tuple(ROPE_SCALINGS)),
}

#: The options of each mechanism (``GPTConfig.attention_options``) are flags in the group of their
#: class (:func:`option_group`), their dests ``attention_options.NAME``; these write some their own
#: way, keeping the names the flags had when the options were fields of the configs.
OPTION_PREFIX = "attention_options."
OPTION_FLAGS = {
    ScalarOptions: {
        "heads": Flag(name="scalar_heads", type=int_at_least(1)),
        "groups": Flag(name="scalar_groups", type=int_at_least(1)),
        "tau": Flag(choices=TAU_KINDS, aliases=("scalar_tau",)),
        "tau_init": Flag(type=positive_number, aliases=("scalar_tau_init",)),
        "tau_cap": Flag(type=positive_number, aliases=("scalar_tau_cap",)),
        "sink": Flag(name="scalar_sink"),
        "tau_length_scaling": Flag(type=int_at_least(1), metavar="T"),
        "reg_spread_range": Flag(type=spread_range),
        **{f"reg_{term}": Flag(metavar="W") for term in ("align", "spread", "tau")},
        **{
            f"reg_{term}_start": Flag(type=int_at_least(0), metavar="STEP")
            for term in ("align", "spread", "tau")
        },
    }
}


def option_group(options: type) -> str:
    """The help group of a mechanism options class's flags: :data:`SCALAR` for the scalar heads',
    ``"attention options (NAME, ...)"`` with the mechanisms that take them for another."""
    return SCALAR if options is ScalarOptions else f"attention options ({', '.join(takers(options))})"


def model_flags() -> dict[str, Flag]:
    """:data:`MODEL_FLAGS` and the flags whose help or choices come from a registry, read when the
    parser is built (so a prior or mechanism registered by then is named)."""
    return MODEL_FLAGS | {
        "prior": Flag(
            help=f"a prior spec: {prior_specs()}; FoX is --attention fox, RoPE --encoding rope ({{default}})"
        ),
        "attention": Flag(group=SCALAR, choices=mechanism_names()),
    }


TRAIN_FLAGS = {
    "data": Flag(group="data"),
    "text_encoding": Flag(group="data"),
    "tokenizer": Flag(group="data", choices=TOKENIZERS),
    "vocab_size": Flag(group="data", type=int_at_least(257)),
    "val_fraction": Flag(group="data"),
    "seq_len": Flag(group="data", type=int_at_least(1)),
    "retrieval_mix": Flag(group="data"),
    "positions": Flag(group="data", choices=POSITIONS),
    "steps": Flag(type=int_at_least(1)),
    "batch_size": Flag(type=int_at_least(1)),
    "grad_accum": Flag(type=int_at_least(1)),
    "optimizer": Flag(choices=OPTIMIZERS),
    "warmup_steps": Flag(name="warmup", type=int_at_least(0)),
    "grad_clip": Flag(type=grad_clip),
    "seed": Flag(type=int_at_least(0)),
    "parallel": Flag(group="processes", choices=PARALLEL),
    "mixed_precision": Flag(group="processes"),
    "checkpoint_activations": Flag(group="processes"),
    "log_every": Flag(group="run", type=int_at_least(1)),
    "eval_every": Flag(group="run", type=int_at_least(0)),
    "eval_sequences": Flag(group="run", type=int_at_least(1)),
    "save_every": Flag(group="run", type=int_at_least(0)),
    "keep_checkpoints": Flag(group="run", type=int_at_least(1)),
}

# Fields of both configs (the training length, the vocabulary): the flag sets the TrainConfig's,
# and the model's follows from it.
SHARED = {field.name for field in dataclasses.fields(TrainConfig)}


def train(args: argparse.Namespace) -> int:
    """Train a GPT on the default corpus or ``--data``; the run goes to ``--out``."""
    from ..train import train as run

    try:
        model_config, config = train_configs(args)
        result = run(model_config, config, args.out, resume=args.resume, progress=not args.quiet)
    except (ValueError, FileNotFoundError, FileExistsError) as e:  # bad flags, data, run dir or checkpoint
        fail(args, with_mechanism_hint(e, getattr(args, "prior", None)))  # a flag not given is absent
    if os.environ.get("RANK", "0") != "0":  # under torchrun, one report
        return 0
    print(
        f"step {result.step}: train loss {result.train_loss:.4f}, val loss {result.val_loss:.4f} "
        f"(unigram baseline {result.unigram_loss:.4f}) nats/token, {result.tokens_per_s:,.0f} tokens/s; "
        f"run in {result.run_dir}"
    )
    return 0


def with_mechanism_hint(error: Exception, prior: str | None) -> Exception:
    """``error``, where ``--prior`` named a mechanism that is not a prior (``fox``, ``rope``), with the
    flags that give it: ``compare --priors`` takes every mechanism, ``train --prior`` only priors."""
    from ..models.named import not_a_prior

    fields = not_a_prior(prior) if isinstance(prior, str) else None
    if fields is None or "unknown prior" not in str(error):
        return error
    flags = " ".join(f"--{key.replace('_', '-')} {value}" for key, value in fields.items())
    return ValueError(f"{error}. {prior!r} is not a prior but a mechanism of its own: give {flags}")


def train_configs(args: argparse.Namespace) -> tuple[GPTConfig, TrainConfig]:
    """``(GPTConfig, TrainConfig)`` from the train flags given (:func:`priorattn.train.resolve_configs`)."""
    from ..train import resolve_configs

    model, config = given(args, GPTConfig, skip=SHARED), given(args, TrainConfig)
    options = {name: value for cls in options_classes() for name, value in given_options(args, cls).items()}
    if options:
        model["attention_options"] = options
    return resolve_configs(args.out, model, config, preset=args.preset, resume=args.resume)


def given_options(args: argparse.Namespace, options: type) -> dict:
    """The options of class ``options`` whose flag the command line gave."""
    return given(args, options, prefix=OPTION_PREFIX)


def add_option_flags(groups: dict, parser: argparse.ArgumentParser) -> None:
    """A flag for every option of every registered mechanism (:func:`options_classes`), in the
    group of its class (made here where new): an option whose name an earlier class has shares
    that class's flag (one dest, ``attention_options.NAME``)."""
    taken: set[str] = set()
    for options in options_classes():
        group = option_group(options)
        if group not in groups:
            groups[group] = parser.add_argument_group(group)
        names = {field.name for field in dataclasses.fields(options)}
        flags = OPTION_FLAGS.get(options, {})
        add_config_flags(groups, options, group, flags, skip=taken, prefix=OPTION_PREFIX)
        taken |= names


def sample(args: argparse.Namespace) -> int:
    """Continue ``--prompt`` with the model a run trained; print the prompt and the continuation."""
    import torch

    from ..scalar.model import add_inference_length_rule
    from ..train import load_run

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
            decoding=None if args.sorted_window is None else "sorted",
            decoding_options=None if args.sorted_window is None else dict(window=args.sorted_window),
        )
    except (ValueError, FileNotFoundError) as e:  # no run there, an empty prompt, a bad temperature
        fail(args, e)
    print(run.tokenizer.decode(tokens[0].tolist()))
    return 0


def export(args: argparse.Namespace) -> int:
    """Copy ``--run`` to ``--out`` with its newest checkpoint as one safetensors file; print its path."""
    from ..train import export_run

    try:
        print(export_run(args.run, args.out))
    except (ValueError, FileNotFoundError, FileExistsError) as e:  # no run, no intact checkpoint, out taken
        fail(args, e)
    return 0


def plot_runs(args: argparse.Namespace) -> int:
    """Draw the training curves of ``RUN_DIR``s into one PNG; print its path."""
    from ..analysis.runs import plot_runs as draw

    try:
        print(draw(args.runs, args.out))
    except (ValueError, FileNotFoundError) as e:  # no metrics, a damaged config.json
        fail(args, e)
    return 0


def add_train_parser(commands) -> None:
    p = commands.add_parser(
        "train",
        help="train a GPT with any prior on the embedded corpus or your own text",
        description=(
            "Train a GPT. The run directory --out gets config.json, data.json, metrics.jsonl and the "
            "checkpoints; --resume continues it after a crash with the arguments it was started with. "
            "Under torchrun every process runs this same command (DDP, or FSDP with --parallel fsdp)."
        ),
    )
    names = ("model", SCALAR, "data", "optimization", "processes", "run")
    groups = {name: p.add_argument_group(name) for name in names}
    groups["model"].add_argument("--preset", choices=sorted(PRESETS), help=f"model size ({DEFAULT_PRESET})")
    run = groups["run"]
    run.add_argument("--out", type=Path, required=True, help="run directory")
    run.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out with its arguments (those given must match; --steps may be raised)",
    )
    skip = SHARED | {"attention_options"}
    add_config_flags(groups, GPTConfig, "model", model_flags(), skip=skip, default="the preset's")
    add_option_flags(groups, p)
    add_config_flags(groups, TrainConfig, "optimization", TRAIN_FLAGS)
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=train, parser=p)


def add_sample_parser(commands) -> None:
    gen = commands.add_parser(
        "sample",
        help="continue a prompt with the model a run trained",
        description="Load RUN's checkpoint and tokenizer and continue --prompt (KV-cached decoding).",
    )
    gen.add_argument("--run", type=Path, required=True, help="a run directory of priorattn train")
    gen.add_argument("--prompt", default="ROMEO.\n", help="text to continue (%(default)r)")
    gen.add_argument("--tokens", type=int_at_least(0), default=200, help="new tokens (%(default)s)")
    gen.add_argument("--temperature", type=float, default=0.8, help="(%(default)s)")
    gen.add_argument("--top-k", type=int_at_least(1), help="sample among the k likeliest tokens")
    gen.add_argument("--greedy", action="store_true", help="always the likeliest token")
    gen.add_argument("--seed", type=int, default=0, help="sampling seed (%(default)s)")
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


def add_export_parser(commands) -> None:
    out = commands.add_parser(
        "export",
        help="copy a run with its checkpoint as one safetensors file (an FSDP run's shards put together)",
        description=(
            "Copy RUN to --out (configs, data record, tokenizer, metrics) with its newest intact "
            "checkpoint written as one checkpoint-<step>.safetensors and its JSON index, as a run "
            "trained on one process or with DDP saves it."
        ),
    )
    out.add_argument("--run", type=Path, required=True, help="a run directory of priorattn train")
    out.add_argument("--out", type=Path, required=True, help="the directory of the copy (new)")
    out.set_defaults(func=export, parser=out)


def add_plot_runs_parser(commands) -> None:
    curves = commands.add_parser(
        "plot-runs",
        help="draw train and validation loss of runs against step",
        description="Draw the loss curves of every RUN_DIR (with the unigram baseline) into --out.",
    )
    curves.add_argument("runs", type=Path, nargs="+", metavar="RUN_DIR")
    curves.add_argument("--out", type=Path, required=True, help="PNG file to write")
    curves.set_defaults(func=plot_runs, parser=curves)
