"""Experiment 8: the length rule ``tau (T / n)^2`` learned in training, against the model's own tau
and against the rule added at inference (docs/scalar_experiments.md section 8).

Seed 002 ("Key insights" 3, "Long Context Behavior") takes trained scalar attention to be local at
any length; experiments 3, 4 and 7 measured that a model trained at 256 bytes attends over most of
a long cache. The rule (:func:`~priorattn.scalar.temperature.length_scaled_tau`) makes it local,
but added after training it costs the model 0.025-0.05 nats per byte past 8 T. Here the rule is
there from the first step, with ``T`` below the training length, so queries late in a training
window already see a shrunken bandwidth and the model learns around it.

Every variant is the benchmark's model (``benchmarks/scalar_decode.py``): the tiny preset with pure
scalar heads at ``2 seq_len`` bytes (256 at every budget), ``L_spread`` 0.1 on (-3, 3) from a third
of the steps and ``L_tau`` 0.1 (experiment 7's recommendation):

- ``own``: no rule; evaluated under its own tau and with the rule at inference (``T`` = 256);
- ``rule{T}``: the rule in training, ``T`` = 32 and 64; tau starts at ``0.1 (256 / T)^2``
  (:func:`~priorattn.scalar.temperature.rule_tau_init`), so the bandwidth at the training length
  starts at ``own``'s 0.1.

Each is scored by :func:`~priorattn.eval.evaluate_ppl` (nats per byte) at 1, 4, 16 and 64 times
the training length (256 to 16384), and its scalar heads' locality is measured at 8 times it: the
mass on the ``k`` keys nearest each query in scalar distance (what a sorted cache reading ``k``
keys holds).
"""

from __future__ import annotations

from pathlib import Path

from ...eval import evaluate_ppl
from ...eval.jobs import eval_documents
from ...figures import RunScale, seed_expectation
from ...scalar import ScalarOptions
from ...scalar.model import add_inference_length_rule
from ...scalar.temperature import rule_tau_init
from .common import (
    Settings,
    Variant,
    attention_maps,
    load_run,
    mass_summary,
    plot_val_curves,
    save_figure,
    summary,
    train_variant,
    validation_windows,
)

#: Evaluation lengths and the length of the locality measurement, in training lengths.
LENGTH_FACTORS = (1, 4, 16, 64)
LOCALITY_FACTOR = 8
#: The rule's T, in training lengths (32 and 64 of 256).
RULE_FRACTIONS = (1 / 8, 1 / 4)
#: Windows scored per evaluation length (``priorattn eval ppl --windows``).
PPL_WINDOWS = 64
#: Keys read (k) and validation windows of the locality measurement (its dense maps: 4 B L^2 per
#: head, layer and window).
LOCALITY_KS = (16, 64, 256)
LOCALITY_WINDOWS = 2
TAU_INIT = ScalarOptions.tau_init  # own's start
REGULARIZERS = dict(reg_spread=0.1, reg_spread_range=(-3.0, 3.0), reg_tau=0.1)


def train_length(settings: Settings) -> int:
    """The benchmark model's 256 bytes at the default settings."""
    return 2 * settings.seq_len


def variants(settings: Settings) -> list[Variant]:
    L = train_length(settings)
    regularized = REGULARIZERS | dict(reg_spread_start=settings.steps // 3)
    scalar = dict(attention="scalar", seq_len=L)
    own = Variant("own", f"own tau (trained at {L})", scalar, options=regularized)
    rules = []
    for fraction in RULE_FRACTIONS:
        T = round(L * fraction)
        rule = dict(tau_length_scaling=T, tau_init=rule_tau_init(TAU_INIT, L, T))
        rules.append(Variant(f"rule{T}", f"rule in training, T = {T}", scalar, options=regularized | rule))
    return [own, *rules]


def run(settings: Settings, out: Path, *, progress: bool = True, log=print) -> dict:
    L = train_length(settings)
    lengths = [L * factor for factor in LENGTH_FACTORS]
    results, scored = {}, {}
    for variant in variants(settings):
        trained = train_variant(variant, settings, out, progress=progress, log=log)
        results[variant.name] = summary(variant, trained)
        evaluations = {variant.name: (variant.label, False)}
        if variant.name == "own":
            evaluations["own_rule_at_inference"] = (f"own tau, rule at inference (T = {L})", True)
        for name, (label, rule) in evaluations.items():
            log(f"{label}: loss at lengths {lengths}")
            model_run = load_run(trained.run_dir)
            if rule:
                add_inference_length_rule(model_run.model, L)
            documents = eval_documents(model_run, trained.run_dir, None)
            ppl = evaluate_ppl(
                model_run.model,
                documents,
                lengths=lengths,
                train_len=L,
                windows=PPL_WINDOWS,
                seed=settings.seed,
                progress=progress,
            )
            tokens = validation_windows(
                model_run, trained.run_dir, L * LOCALITY_FACTOR, LOCALITY_WINDOWS, settings.seed
            )
            locality = mass_summary(attention_maps(model_run.model, tokens), LOCALITY_KS)
            scored[name] = dict(
                label=label,
                lengths=lengths,
                loss=ppl["loss"],
                windows=ppl["windows"],
                tail_loss=ppl["tail_loss"],
                mass_captured=locality,
            )
    figures = [
        plot_val_curves(
            results,
            out,
            "val_loss.png",
            "Experiment 8: the length rule in training",
            TRAIN_CAPTION,
            run=settings.scale,
        ),
        plot_lengths(scored, out, "length_rule.png", L, run=settings.scale),
    ]
    return dict(
        variants=results,
        evaluations=scored,
        train_len=L,
        locality_length=L * LOCALITY_FACTOR,
        locality_ks=list(LOCALITY_KS),
        locality_windows=LOCALITY_WINDOWS,
        ppl_windows=PPL_WINDOWS,
        figures=figures,
    )


TRAIN_CAPTION = (
    "Validation loss at the training length (256 bytes at budget 1) of the tiny scalar model without "
    "the length rule and with it in training (T = 32 and 64), trained alike otherwise (L_spread 0.1 "
    "on (-3, 3) from a third of the steps, L_tau 0.1)."
)


#: The k whose nearest keys must hold most of the mass for attention to count as local.
LOCAL_K = "64"


def expectation(scored: dict[str, dict], train_len: int, run: RunScale) -> str:
    """Seed 002's "Long Context Behavior", judged on the model trained without the rule, under its
    own tau (``"own"``): its attention is local at ``LOCALITY_FACTOR`` training lengths when the
    :data:`LOCAL_K` keys nearest each query hold more than half its mass."""
    mass = scored["own"]["mass_captured"]["nearest"].get(LOCAL_K)
    length = LOCALITY_FACTOR * train_len
    measured = (
        f"at {length} bytes the {LOCAL_K} nearest scalar keys hold "
        + ("nothing measured" if mass is None else f"{mass:.3f}")
        + " of the own-tau model's mass"
    )
    return seed_expectation(
        "Seed 002 expects a trained model's own attention to be local at any length (here: more than "
        f"half the mass on the {LOCAL_K} nearest scalar keys).",
        None if mass is None else mass > 0.5,
        measured,
        run,
    )


def plot_lengths(scored: dict[str, dict], out: Path, name: str, train_len: int, *, run: RunScale) -> str:
    """Loss against evaluation length (left) and the mass on the ``k`` nearest scalar keys at
    ``LOCALITY_FACTOR`` training lengths against ``k`` (right), one line per evaluation; the
    caption judges the seed's expectation (:func:`expectation`)."""
    from ...figures import captioned_figure

    caption = (
        "Left: loss (nats per byte, mean over every position of up to "
        f"{PPL_WINDOWS} validation windows) against the window length; the dotted line marks the "
        f"training length {train_len}. Right: on validation windows of {LOCALITY_FACTOR * train_len} "
        "bytes, the attention mass on the k keys nearest each query in scalar distance (mean over "
        "layers, heads and queries that see more than k keys): what a sorted cache reading k keys "
        "holds. 'rule at inference' is the rule added to a model trained without it. "
        f"{expectation(scored, train_len, run)}"
    )
    fig, panel = captioned_figure((12, 4.6), caption, run=run)
    ax_loss, ax_mass = panel.subplots(1, 2)
    for entry in scored.values():
        ax_loss.plot(entry["lengths"], entry["loss"], marker="o", label=entry["label"])
        nearest = entry["mass_captured"]["nearest"]
        ax_mass.plot([int(k) for k in nearest], list(nearest.values()), marker="o", label=entry["label"])
    ax_loss.axvline(train_len, color="0.5", linestyle=":", linewidth=1)
    ax_loss.set(xlabel="window length (bytes)", ylabel="loss (nats per byte)", title="Loss against length")
    ax_mass.set(
        xlabel="k: keys read",
        ylabel="attention mass captured",
        title=f"Mass on the k nearest scalar keys at {LOCALITY_FACTOR * train_len} bytes",
        ylim=(0, 1.02),
    )
    for ax in (ax_loss, ax_mass):
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    panel.suptitle("Experiment 8: local attention learned with the length rule")
    return save_figure(fig, out, name)
