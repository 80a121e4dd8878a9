"""Evaluations of a run directory: each job loads the trained model, scores it, and writes
``results.json`` and its plots into an output directory (what ``priorattn eval`` runs). The
directory is a run of ``priorattn train``, or a ``transformers`` model that ``priorattn hf-extend``
wrote (its training length is the extension's ``seq_len``).

The text is the run's own validation split by default (:func:`priorattn.data.run_documents`), or
any corpus source (``data=``: a text file, folder, glob, ``hf:PATH``; its text files decoded with
``text_encoding``), so a model can be scored on
text it never saw. Default lengths run from the training length ``T`` to ``64 T`` in powers of two.

Every ``results.json`` records the ``checkpoint`` it scored (:func:`checkpoint_identity`), so a result
is never mistaken for one of the same run trained further.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..data import load_corpus, run_documents
from ..data.retrieval import NIAH_VARIANTS, RetrievalTask, default_filler
from ..data.tokenizer import Tokenizer
from ..files import prepare_out, read_json, sha256_of, write_json_atomic
from ..train import load_run
from ..train.checkpoint import CheckpointError, checkpoint_indexes
from ..train.runs import run_label
from .plots import TASK_TITLES, plot_accuracy_vs_length, plot_ppl, plot_retrieval_heatmaps
from .ppl import check_lengths, evaluate_ppl
from .retrieval import evaluate_retrieval, uniform_depths

RESULTS_JSON = "results.json"
DEFAULT_FACTORS = (1, 2, 4, 8, 16, 32, 64)


@dataclass
class ScoredModel:
    """What an evaluation needs of a run: a model called as :class:`~priorattn.models.GPT` is
    (``model(tokens, caches=...) -> (logits, loss, caches)``), its tokenizer and training length,
    and the identity of its weights (:func:`checkpoint_identity`)."""

    model: object
    tokenizer: Tokenizer
    train_len: int
    checkpoint: dict


def is_hf_dir(run_dir: Path) -> bool:
    """A ``transformers`` directory from ``hf-extend``: its ``config.json`` names a ``model_type``."""
    config = run_dir / "config.json"
    return config.is_file() and "model_type" in read_json(config)


def load_scored(run_dir: Path) -> ScoredModel:
    """The model of a ``priorattn train`` run, or of a ``transformers`` directory from ``hf-extend``
    (loading it needs ``priorattn[hf]``)."""
    if is_hf_dir(run_dir):
        from ..hf.extend import load_extended

        model, tokenizer, train_len = load_extended(run_dir)
        return ScoredModel(model, tokenizer, train_len, checkpoint_identity(run_dir))
    run = load_run(run_dir)
    return ScoredModel(
        run.model, run.tokenizer, run.model_config.seq_len, checkpoint_identity(run_dir, run.step)
    )


def checkpoint_identity(run_dir: str | Path, step: int | None = None) -> dict:
    """``{"step", "sha256"}``: which weights of ``run_dir`` an evaluation scores, the key (with the
    settings) that saved results are reused under.

    For a run of ``priorattn train``: its checkpoint at ``step`` (``None``: the newest), with the
    sha256 of the tensor file as the checkpoint's index records it (:func:`~priorattn.train.load_run`
    checks the file against it before loading). For an ``hf-extend`` directory: ``step`` ``None``
    and the sha256 of its weight files, in name order. Raises
    :class:`~priorattn.train.checkpoint.CheckpointError` when the run has no such checkpoint.
    """
    run_dir = Path(run_dir)
    if is_hf_dir(run_dir):
        from ..hf.extend import WEIGHT_FILES

        weights = sorted(p for pattern in WEIGHT_FILES for p in run_dir.glob(pattern))
        return dict(step=None, sha256=sha256_of(*weights))
    for index_path in checkpoint_indexes(run_dir):
        try:
            index = json.loads(index_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue  # a damaged index is never the one loaded
        if step is None or index.get("step") == step:
            return dict(step=index.get("step"), sha256=index.get("sha256"))
    raise CheckpointError(f"no checkpoint{'' if step is None else f' at step {step}'} in {run_dir}")


def default_lengths(train_len: int, factors: Sequence[int] = DEFAULT_FACTORS) -> list[int]:
    return [train_len * f for f in factors]


def eval_documents(run, run_dir: Path, data: str | None, text_encoding: str = "utf-8") -> list[np.ndarray]:
    """Token arrays of the evaluation text: ``data``'s documents, or the run's validation split."""
    if data is None:
        documents = run_documents(run_dir, "val")
    else:
        documents = load_corpus(data, text_encoding)
    tokens = [np.asarray(run.tokenizer.encode(doc.read()), dtype=np.int64) for doc in documents]
    return [t for t in tokens if len(t)]


def ppl_job(
    run_dir: str | Path,
    out: str | Path,
    *,
    data: str | None = None,
    text_encoding: str = "utf-8",
    lengths: Sequence[int] | None = None,
    windows: int = 8,
    seed: int = 0,
    progress: bool = True,
    tau_length_scaling: bool = False,
) -> dict:
    """:func:`~priorattn.eval.evaluate_ppl` of the run in ``run_dir``; writes ``results.json`` and
    ``ppl.png`` into ``out``. ``tau_length_scaling``: scalar heads of a model trained without the
    rule use ``tau (T / n)^2`` past the training length ``T``
    (:func:`priorattn.scalar.model.add_inference_length_rule`); a model trained with it applies
    its own at every length either way."""
    run_dir = Path(run_dir)
    run = load_scored(run_dir)
    T = run.train_len
    if tau_length_scaling:
        from ..scalar.model import add_inference_length_rule

        add_inference_length_rule(run.model, T)
    out = prepare_out(out)
    documents = eval_documents(run, run_dir, data, text_encoding)
    result = evaluate_ppl(
        run.model,
        documents,
        lengths=default_lengths(T) if lengths is None else lengths,
        train_len=T,
        windows=windows,
        seed=seed,
        progress=progress,
    )
    result = (
        dict(run=str(run_dir), checkpoint=run.checkpoint, data=data or "validation split", seed=seed) | result
    )
    result["tau_length_scaling"] = tau_length_scaling
    write_json_atomic(out / RESULTS_JSON, result)
    plot_ppl({run_label(run_dir): result}, out / "ppl.png")
    return result


def passkey_job(
    run_dir: str | Path,
    out: str | Path,
    *,
    data: str | None = None,
    text_encoding: str = "utf-8",
    lengths: Sequence[int] | None = None,
    depths: int = 20,
    trials: int = 3,
    digits: int = 5,
    seed: int = 0,
    progress: bool = True,
) -> dict:
    """Passkey retrieval (seed 003 Sec. 3.1) of the run in ``run_dir`` at ``depths`` uniformly
    spaced depths; writes ``results.json``, ``heatmap.png`` and, over more than one length (a line
    through one point says nothing), ``accuracy.png`` into ``out``. ``data`` and ``text_encoding``
    are not read by the passkey (its haystack is the repeated filler) but are accepted for a uniform
    command line."""
    run_dir, out = Path(run_dir), prepare_out(out)
    run = load_scored(run_dir)
    T = run.train_len
    task = RetrievalTask(
        "passkey", run.tokenizer, default_filler("passkey", run.tokenizer, None), digits=digits
    )
    result = evaluate_retrieval(
        run.model,
        task,
        lengths=default_lengths(T) if lengths is None else lengths,
        depths=uniform_depths(depths),
        trials=trials,
        seed=seed,
        progress=progress,
    )
    result = dict(run=str(run_dir), checkpoint=run.checkpoint, seed=seed, digits=digits, train_len=T) | result
    write_json_atomic(out / RESULTS_JSON, result)
    label = run_label(run_dir)
    plot_retrieval_heatmaps({label: result}, out / "heatmap.png", title=TASK_TITLES["passkey"])
    if len(result["lengths"]) > 1:
        plot_accuracy_vs_length({label: result}, out / "accuracy.png", title=TASK_TITLES["passkey"])
    return result


def niah_job(
    run_dir: str | Path,
    out: str | Path,
    *,
    data: str | None = None,
    text_encoding: str = "utf-8",
    variants: Sequence[str] = NIAH_VARIANTS,
    lengths: Sequence[int] | None = None,
    depths: int = 5,
    trials: int = 3,
    seed: int = 0,
    progress: bool = True,
) -> dict:
    """RULER-style needle-in-a-haystack of the run in ``run_dir`` for each of ``variants``; writes
    ``results.json`` (``{"variants": {name: result}}``), one heatmap per variant and
    ``accuracy.png`` into ``out``. Corpus haystacks come from the evaluation text. A variant is
    evaluated at the ``lengths`` that hold its prompt (multi-needle prompts need a few hundred
    tokens)."""
    unknown = [v for v in variants if v not in NIAH_VARIANTS]
    if unknown or not variants:
        raise ValueError(
            f"unknown NIAH variant {unknown[0] if unknown else None!r}: use some of {NIAH_VARIANTS}"
        )
    if lengths is not None:
        check_lengths(lengths)  # before a variant drops the lengths too short for its prompt
    run_dir, out = Path(run_dir), prepare_out(out)
    run = load_scored(run_dir)
    T = run.train_len
    corpus = np.concatenate(eval_documents(run, run_dir, data, text_encoding))
    per_variant = {}
    lengths = default_lengths(T) if lengths is None else lengths
    for name in variants:
        task = RetrievalTask(name, run.tokenizer, default_filler(name, run.tokenizer, corpus))
        usable = [n for n in lengths if n >= task.min_length()]  # multi-needle prompts are long
        if not usable:
            raise ValueError(
                f"NIAH {name} needs prompts of at least {task.min_length()} tokens: give longer --lengths"
            )
        per_variant[name] = evaluate_retrieval(
            run.model,
            task,
            lengths=usable,
            depths=uniform_depths(depths),
            trials=trials,
            seed=seed,
            progress=progress,
        )
    result = dict(run=str(run_dir), checkpoint=run.checkpoint, data=data or "validation split", seed=seed)
    result |= dict(train_len=T, variants=per_variant)
    write_json_atomic(out / RESULTS_JSON, result)
    label = run_label(run_dir)
    for name, r in per_variant.items():
        plot_retrieval_heatmaps({label: r}, out / f"heatmap_{name}.png", title=TASK_TITLES[name])
    plot_accuracy_vs_length(
        {name: r | dict(train_len=T) for name, r in per_variant.items()},
        out / "accuracy.png",
        title=f"Needle in a haystack, every variant: {label}",
    )
    return result
