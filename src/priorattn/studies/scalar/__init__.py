"""Seed 002's proposed experiments as commands: ``priorattn scalar-exp N --out DIR [--budget B]``.

:data:`EXPERIMENTS` maps each experiment's number to its description and its ``run(settings, out,
*, progress, log) -> dict`` (a module of this package each); :func:`run_experiment` trains what it
needs into ``DIR/runs`` (reused on a re-run) and writes ``DIR/results.json`` and its figures,
both stating the budget and steps (``"scale"``; below budget 1 a smoke run).
See ``docs/scalar_experiments.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from ...files import prepare_out, write_json_atomic
from . import (
    alignment,
    context_length,
    goat,
    hybrid_vs_standard,
    length_rule,
    regularizer_ablation,
    sink,
    weight_search,
)
from .common import RESULTS_JSON, Settings


@dataclass(frozen=True)
class Experiment:
    description: str
    run: Callable[..., dict]


EXPERIMENTS: dict[int, Experiment] = {
    1: Experiment(
        "pure scalar vs hybrid vs standard attention: validation loss curves", hybrid_vs_standard.run
    ),
    2: Experiment(
        "|q_s - k_s| against attention weight in the hybrid, without and with L_align", alignment.run
    ),
    3: Experiment(
        "regularizer ablation (none, align, align+tau, align+spread, all): val loss, tau, mass at k",
        regularizer_ablation.run,
    ),
    4: Experiment(
        "sorted-cache decode error against context length (128 to 4096) at fixed k, hybrid without "
        "and with the regularizers",
        context_length.run,
    ),
    5: Experiment("the scalar sink: the mass it absorbs and tau over training", sink.run),
    6: Experiment("GOAT vs the hybrid vs both combined: validation loss curves", goat.run),
    7: Experiment(
        "a search over the regularizer weights (align, spread, tau, spread range and start): val loss "
        "against mass at k, the Pareto front, its best confirmed at the next seed",
        weight_search.run,
    ),
    8: Experiment(
        "the length rule tau (T / n)^2 in training (T = 32, 64 of 256) against the model's own tau and "
        "the rule added at inference: loss at 256 to 16384 bytes, mass on the k nearest keys",
        length_rule.run,
    ),
}


def run_experiment(
    number: int, out: str | Path, budget: float = 1.0, *, seed: int = 0, progress: bool = True, log=print
) -> dict:
    """Run experiment ``number`` at ``budget`` with ``seed`` into ``out``; write and return its results."""
    if number not in EXPERIMENTS:
        raise ValueError(f"no experiment {number!r}: choose one of {sorted(EXPERIMENTS)}")
    settings = Settings.for_budget(budget, seed)
    out = prepare_out(out)
    experiment = EXPERIMENTS[number]
    results = experiment.run(settings, out, progress=progress, log=log)
    results = (
        dict(
            experiment=number,
            description=experiment.description,
            budget=budget,
            scale=settings.scale.record(),
            settings=asdict(settings),
        )
        | results
    )
    write_json_atomic(out / RESULTS_JSON, results)
    return results


__all__ = ["EXPERIMENTS", "Experiment", "Settings", "run_experiment"]
