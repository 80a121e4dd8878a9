"""``priorattn eval {ppl,passkey,niah}``, ``compare`` and ``retrieval``: score one run beyond its
training length; train every positional mechanism alike and compare them; the synthetic retrieval
study."""

from __future__ import annotations

import argparse
from pathlib import Path

from .parsing import (
    add_experiment_options,
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

    try:
        config = CompareConfig.for_budget(args.budget, args.priors, args.retrieval_mechanisms)
        if args.no_retrieval:
            config = replace(config, retrieval=None)
        config = replace(config, data=args.data, text_encoding=args.text_encoding)
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
    from ..studies.retrieval.report import run_retrieval_study, summary_lines
    from ..studies.retrieval.study import RetrievalStudyConfig
    from ..studies.retrieval.sweep import run_retrieval_sweep

    fields = dict(
        mechanisms=args.mechanisms,
        seeds=args.seeds,
        tasks=args.tasks,
        train_len=args.train_len,
        token_shift=args.token_shift,
        steps=args.steps,
        stop_at_criterion=False if args.fixed_steps else None,
        curriculum_steps=args.curriculum_steps,
        prior_lr=args.prior_lr,
        task_weights=args.task_weights,
    )
    try:
        if args.sweep and args.train_len is not None:
            raise ValueError("--train-len with --sweep: the sweep trains at each of its lengths")
        config = RetrievalStudyConfig.for_budget(
            args.budget, **{k: v for k, v in fields.items() if v is not None}
        )
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


def add_compare_parser(commands) -> None:
    from ..models.positions import mechanisms
    from ..studies.compare.study import DEFAULT_MODELS, CompareConfig
    from ..studies.retrieval.study import DEFAULT_MECHANISMS, all_mechanisms

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
        type=mechanism_list(list(mechanisms())),
        help=f"comma-separated mechanisms, e.g. {','.join(DEFAULT_MODELS)} (the default), or prior specs "
        "that are one of them, as train --prior writes them: goat(slope=none) is goat_noslope",
    )
    p.add_argument("--data", help="text file, folder, glob or hf:PATH to train on (the embedded Shakespeare)")
    p.add_argument("--text-encoding", default="utf-8", help="how --data's text files are decoded (utf-8)")
    study = p.add_mutually_exclusive_group()
    study.add_argument(
        "--retrieval-mechanisms",
        type=mechanism_list(list(all_mechanisms())),
        help=f"mechanisms of the synthetic retrieval study ({','.join(DEFAULT_MECHANISMS)})",
    )
    study.add_argument("--no-retrieval", action="store_true", help="skip the synthetic retrieval study")
    add_experiment_options(p, CompareConfig().steps, seed_help=None)
    p.set_defaults(func=compare, parser=p)


def add_retrieval_parser(commands) -> None:
    from ..data.synthetic import SYNTHETIC_TASKS
    from ..studies.retrieval.study import DEFAULT_MECHANISMS, RetrievalStudyConfig, all_mechanisms

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
        type=mechanism_list(list(all_mechanisms())),
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
        "--task-weights",
        type=positive_numbers,
        help="comma-separated shares of the training sequences, one per task of --tasks, e.g. 3,1 "
        "(equal shares)",
    )
    protocol = p.add_argument_group(
        "training protocol", "the settings the study fixes, as options to measure what each changes"
    )
    protocol.add_argument(
        "--steps",
        type=int_at_least(1),
        help=f"training steps at budget 1, scaled by --budget: a cap, or with --fixed-steps the count "
        f"({defaults.steps})",
    )
    protocol.add_argument(
        "--fixed-steps",
        action="store_true",
        help="train every model all its steps rather than stopping when it answers every check sequence at T",
    )
    protocol.add_argument(
        "--curriculum-steps",
        type=int_at_least(0),
        help=f"steps over which the longest training length rises to T, scaled by --budget below 1; "
        f"0: no length curriculum ({defaults.curriculum_steps})",
    )
    protocol.add_argument(
        "--prior-lr",
        type=positive_number,
        help=f"learning rate of the priors and SSMax ({defaults.prior_lr:g}; the rest {defaults.lr:g})",
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
    add_experiment_options(p, defaults.steps, seed_help=None)
    p.set_defaults(func=retrieval, parser=p)
