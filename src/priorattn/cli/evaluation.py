"""``priorattn eval {ppl,passkey,niah}``, ``compare`` and ``retrieval``: score one run beyond its
training length; train every positional mechanism alike and compare them; the synthetic retrieval
study. ``compare``'s and ``retrieval``'s flags are the fields of the studies' configs
(:mod:`priorattn.cli.configs`)."""

from __future__ import annotations

import argparse
import inspect
from pathlib import Path

from .configs import Flag, add_study_flags, budget_config, field_default, given
from .parsing import (
    fail,
    int_at_least,
    int_list,
    mechanism_list,
    name_list,
    positive_number,
    positive_numbers,
    seed_list,
)


def evaluate(args: argparse.Namespace) -> int:
    """``priorattn eval {ppl,passkey,niah}``: score a run, write results.json and plots to --out."""
    from .. import eval as evaluations

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
        result = job(args.run, out, **options)
    except (ValueError, FileNotFoundError, FileExistsError) as e:  # no run, bad data, lengths, out
        fail(args, e)
    if args.task == "ppl":
        print(ppl_summary(result, args.windows))
    print(f"{args.task}: results in {out}")
    return 0


def ppl_summary(result: dict, asked: int) -> str:
    """The console's lines for ``eval ppl``: perplexity and the paired delta per length, and a note
    for each length where the text held fewer windows than ``asked`` (results.json records how many
    were scored, but an interval from 4 windows is not one from 8)."""
    lines = ["length  windows  ppl      paired delta"]
    for length, windows, ppl, delta in zip(
        result["lengths"], result["windows"], result["ppl"], result["paired_delta"]
    ):
        shown = "" if delta is None else f"{delta:+.3f}"
        lines.append(f"{length:>6}  {windows:>7}  {ppl:<7.2f}  {shown}")
    short = [(length, n) for length, n in zip(result["lengths"], result["windows"]) if n < asked]
    if short:
        where = ", ".join(f"{n} at {length}" for length, n in short)
        lines.append(
            f"note: the text holds fewer windows than --windows {asked} at some lengths; scored {where} "
            "(give --data a longer text for more)"
        )
    return "\n".join(lines)


def compare(args: argparse.Namespace) -> int:
    """Train every positional mechanism alike, evaluate them all, write DIR/report.html."""
    from dataclasses import replace

    from ..studies.compare.report import summary_lines
    from ..studies.compare.study import CompareConfig
    from ..studies.compare.study import compare as run
    from ..studies.retrieval.study import RetrievalStudyConfig

    try:
        config = budget_config(args, CompareConfig)
        if args.no_retrieval:
            config = replace(config, retrieval=None)
        elif args.retrieval_mechanisms is not None:
            study = RetrievalStudyConfig.for_budget(args.budget, mechanisms=args.retrieval_mechanisms)
            config = replace(config, retrieval=study)
        data = run(config, args.out, progress=not args.quiet)
    except (ValueError, FileNotFoundError, FileExistsError) as e:
        fail(args, e)
    for line in summary_lines(data):
        print(line)
    print(f"report: {args.out / 'report.html'}")
    return 0


def retrieval(args: argparse.Namespace) -> int:
    """Train tiny models on synthetic retrieval per mechanism and seed; score them far beyond T (with
    ``--sweep``, at two model sizes and two training lengths)."""
    from ..studies.retrieval.report import summary_lines
    from ..studies.retrieval.run import run_retrieval_study
    from ..studies.retrieval.study import RetrievalStudyConfig
    from ..studies.retrieval.sweep import run_retrieval_sweep

    fields = given(args, RetrievalStudyConfig, skip={"budget"})
    if args.fixed_steps:
        fields["stop_at_criterion"] = False
    try:
        if args.sweep and "train_len" in fields:
            raise ValueError("--train-len with --sweep: the sweep trains at each of its lengths")
        config = RetrievalStudyConfig.for_budget(args.budget, **fields)  # scaling the steps given
        if args.sweep:
            run_retrieval_sweep(config, args.out, workers=args.workers, progress=not args.quiet)
        else:
            data = run_retrieval_study(config, args.out, workers=args.workers, progress=not args.quiet)
            for line in summary_lines(data):
                print(line)
    except (ValueError, FileNotFoundError, FileExistsError) as e:
        fail(args, e)
    print(f"report: {args.out / 'report.html'}")
    return 0


def add_eval_parser(commands) -> None:
    from .. import eval as evaluations
    from ..data.retrieval import NIAH_VARIANTS

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
        passkey="passkey retrieval at needle depths (seed 003 Sec. 3.1)",
        niah="RULER-style needle in a haystack, six variants",
    )
    for task, text in helps.items():
        # each flag's default is the job's (eval.ppl_job, passkey_job, niah_job)
        job = getattr(evaluations, f"{task}_job")
        default = {name: p.default for name, p in inspect.signature(job).parameters.items()}
        t = tasks.add_parser(task, help=text, description=text)
        t.add_argument(
            "--run", type=Path, required=True, help="a run directory of priorattn train, or of hf-extend"
        )
        t.add_argument(
            "--data", help="text file, folder, glob or hf:PATH to score (the run's validation split)"
        )
        t.add_argument(
            "--text-encoding",
            default=default["text_encoding"],
            help="how --data's text files are decoded (%(default)s)",
        )
        t.add_argument("--lengths", type=int_list, help="comma-separated lengths in tokens (T, 2T, ..., 64T)")
        t.add_argument("--out", type=Path, help="output directory (RUN/eval/TASK)")
        t.add_argument("--seed", type=int_at_least(0), default=default["seed"], help="(%(default)s)")
        t.add_argument("--quiet", action="store_true", help="no progress bar")
        if task == "ppl":
            windows = default["windows"]
            t.add_argument(
                "--windows", type=int_at_least(1), default=windows, help="windows per length (%(default)s)"
            )
            t.add_argument(
                "--tau-length-scaling",
                action="store_true",
                help="scalar heads: a query seeing n > T keys uses tau (T / n)^2 (docs/scalar_decoding.md)",
            )
        else:
            depths, trials = default["depths"], default["trials"]
            t.add_argument(
                "--depths", type=int_at_least(1), default=depths, help="needle depths (%(default)s)"
            )
            t.add_argument(
                "--trials", type=int_at_least(1), default=trials, help="prompts per cell (%(default)s)"
            )
        if task == "passkey":
            digits = default["digits"]
            t.add_argument(
                "--digits", type=int_at_least(1), default=digits, help="passkey digits (%(default)s)"
            )
        if task == "niah":
            t.add_argument(
                "--variants",
                type=name_list(NIAH_VARIANTS, "NIAH variant"),
                default=list(default["variants"]),
                help="comma-separated (all)",
            )
        t.set_defaults(func=evaluate, parser=t)


def add_compare_parser(commands) -> None:
    from ..data.retrieval import NIAH_VARIANTS
    from ..models.named import mechanisms
    from ..models.presets import PRESETS
    from ..studies.compare.study import CompareConfig
    from ..studies.retrieval.study import RetrievalStudyConfig, all_mechanisms

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
    counts = ("seq_len", "window", "steps", "batch_size", "ppl_windows", "passkey_depths", "niah_depths")
    flags = {name: Flag(type=int_at_least(1)) for name in (*counts, "trials")}
    flags |= dict(
        models=Flag(name="priors", type=mechanism_list(list(mechanisms()))),
        preset=Flag(choices=tuple(sorted(PRESETS))),
        seed=Flag(type=int_at_least(0)),
        ppl_factors=Flag(type=int_list),
        retrieval_factors=Flag(type=int_list),
        niah_variants=Flag(type=name_list(NIAH_VARIANTS, "NIAH variant")),
    )
    add_study_flags(p, CompareConfig, flags, skip={"retrieval"})
    study = p.add_mutually_exclusive_group()
    mechanisms_flag = study.add_argument(
        "--retrieval-mechanisms",
        type=mechanism_list(list(all_mechanisms())),
        help="mechanisms of the synthetic retrieval study run first (%(shown_default)s)",
    )
    mechanisms_flag.shown_default = field_default(RetrievalStudyConfig, "mechanisms")
    study.add_argument("--no-retrieval", action="store_true", help="skip the synthetic retrieval study")
    p.set_defaults(func=compare, parser=p)


def add_retrieval_parser(commands) -> None:
    from ..data.synthetic import SYNTHETIC_TASKS
    from ..studies.retrieval.study import RetrievalStudyConfig, all_mechanisms

    p = commands.add_parser(
        "retrieval",
        help="synthetic retrieval far beyond the training length, per positional mechanism",
        description=(
            "Train one tiny model per (mechanism, seed) on synthetic retrieval sequences (answers only in "
            "the loss, lengths up to T), score exact match at T to 64 T (512 T from --budget 2) on the "
            "same sequences for every model, and write DIR/report.html and DIR/results.json with "
            "intervals, heatmaps, the learned priors and the seeds' claims judged. A re-run reuses "
            "finished models and scores. A field given is scaled by --budget as its default is."
        ),
    )
    protocol = p.add_argument_group(
        "training protocol", "the settings the study fixes, as options to measure what each changes"
    )
    sizes = ("train_len", "d_model", "n_layers", "n_heads", "batch_size", "check_every", "check_prompts")
    flags = {name: Flag(type=int_at_least(1)) for name in (*sizes, "depths", "prompts")}
    flags |= {name: Flag(type=int_at_least(0)) for name in ("goat_freqs", "warmup_steps", "eval_seed")}
    flags |= dict(
        mechanisms=Flag(type=mechanism_list(list(all_mechanisms()))),
        seeds=Flag(type=seed_list),
        tasks=Flag(type=name_list(list(SYNTHETIC_TASKS), "task")),
        task_weights=Flag(type=positive_numbers, group="protocol"),
        lr=Flag(type=positive_number),
        factors=Flag(type=int_list),
        steps=Flag(type=int_at_least(1), group="protocol"),
        curriculum_steps=Flag(type=int_at_least(0), group="protocol"),
        prior_lr=Flag(type=positive_number, group="protocol"),
    )
    skip = {"stop_at_criterion"}  # --fixed-steps
    add_study_flags(p, RetrievalStudyConfig, flags, skip=skip, groups={"protocol": protocol})
    protocol.add_argument(
        "--fixed-steps",
        action="store_true",
        help="train every model all its steps rather than stopping when it answers every check sequence at T",
    )
    p.add_argument(
        "--workers",
        type=int_at_least(1),
        help="processes training models side by side, one thread each (one per CPU core)",
    )
    p.add_argument(
        "--sweep",
        action="store_true",
        help="run the study at 2 layers x width 64 and 4 x 128, each at T = 64 and 256, into DIR/cells/, "
        "and report which verdicts hold across them (hours at budget 1 on a CPU)",
    )
    p.set_defaults(func=retrieval, parser=p)
