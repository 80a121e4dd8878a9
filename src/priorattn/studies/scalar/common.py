"""What every experiment of seed 002 ("Proposed Experiments") needs: trained variants, their curves,
their scalar heads' attention, and the results file.

An experiment trains a few :class:`Variant` s (GPT fields + training fields) alike at the
:class:`Settings` of a budget into ``DIR/runs/NAME`` (:func:`train_variant`; a finished run is
reused, as ``priorattn compare`` reuses its models), reads their curves from ``metrics.jsonl``
(:func:`val_curve`, :func:`metric_curve`), loads the trained models (:func:`load_run`) and measures
their scalar heads on validation windows (:func:`validation_windows`, :func:`attention_maps`,
:func:`mass_captured`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from ...data import vocab_size_of
from ...figures import RunScale
from ...models import GPT, GPTConfig, preset
from ...scalar.layers import ScalarAttentionMap, ScalarMultiheadAttention
from ...train import TrainConfig, TrainedRun, TrainResult, load_run, train
from ...train.runs import METRICS_JSONL, read_metrics

RESULTS_JSON = "results.json"
#: Optimizer steps at budget 1: 3-6 minutes per tiny model on a shared 2-core machine.
STEPS = 300
#: The k of seed 002 experiment 3 ("inference approximation error at k = 8, 16, 32, 64").
MASS_KS = (8, 16, 32, 64)


@dataclass(frozen=True)
class Variant:
    """One model an experiment trains: ``name`` (its run directory ``runs/NAME``), ``label`` (for
    legends), the :class:`GPTConfig` fields it sets, the :class:`TrainConfig` fields it sets and
    the options of its attention mechanism it sets (``GPTConfig.attention_options``: the scalar
    heads' shape and regularizers, :class:`~priorattn.scalar.ScalarOptions`)."""

    name: str
    label: str
    model: dict = field(default_factory=dict)
    train: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)


@dataclass
class Settings:
    """What the variants of every experiment share; :meth:`for_budget` makes one from ``--budget``.

    Budget 1 trains the ``tiny`` preset (4 layers, 4 heads, d_model 128, bytes) for 300 steps of
    8 x 128 tokens (the seed's "ctx-128") on the embedded corpus, evaluating validation loss 10 times.

    - ``seed``: the seed of initial weights, batches and validation windows: another seed is a
      replicate.
    - ``evaluations``: validation points per loss curve.
    - ``windows``: the validation windows the attention measurements average over.
    - ``budget``: the one these settings were made for (:attr:`scale`).
    """

    steps: int = STEPS
    preset: str = "tiny"
    seq_len: int = 128
    batch_size: int = 8
    evaluations: int = 10
    eval_sequences: int = 64
    windows: int = 8
    seed: int = 0
    budget: float = 1.0

    @property
    def scale(self) -> RunScale:
        """The budget and steps every figure and ``results.json`` of the experiment state."""
        return RunScale(self.steps, STEPS, self.budget)

    @classmethod
    def for_budget(cls, budget: float = 1.0, seed: int = 0) -> Settings:
        """Training steps scale with ``budget`` (at least 2); ``seed`` sets initial weights, batches
        and validation windows (another seed is a replicate)."""
        number = isinstance(budget, (int, float)) and not isinstance(budget, bool)
        if not number or not 0 < budget < math.inf:
            raise ValueError(f"budget must be a positive finite number, got {budget!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {seed!r}")
        return cls(steps=max(2, round(STEPS * budget)), seed=seed, budget=budget)

    def model_config(self, variant: Variant) -> GPTConfig:
        fields = dict(seq_len=self.seq_len, vocab_size=vocab_size_of("byte")) | variant.model
        if variant.options:
            fields["attention_options"] = variant.options
        return preset(self.preset, **fields)

    def train_config(self, variant: Variant) -> TrainConfig:
        fields = dict(
            steps=self.steps,
            batch_size=self.batch_size,
            seed=self.seed,
            warmup_steps=min(100, self.steps // 10),
            eval_every=max(1, self.steps // self.evaluations),
            eval_sequences=self.eval_sequences,
            log_every=max(1, min(10, self.steps // 10)),  # the tau trajectory: 10 points or more
            save_every=0,
        )
        return TrainConfig(**(fields | variant.train))


def train_variant(
    variant: Variant, settings: Settings, out: Path, *, progress: bool = True, log=print
) -> TrainResult:
    """Train ``variant`` at ``settings`` into ``out/runs/NAME``; a finished run there is only read
    back (one with other settings is refused, naming the differences, by :func:`priorattn.train`)."""
    run_dir = run_path(out, variant)
    log(f"{variant.label}: {settings.steps} steps in {run_dir}")
    return train(
        settings.model_config(variant),
        settings.train_config(variant),
        run_dir,
        resume=True,
        progress=progress,
    )


def compare_variants(
    variants: Sequence[Variant],
    settings: Settings,
    out: Path,
    title: str,
    captions: tuple[str, str],
    expectation: Callable[[dict[str, dict], RunScale], str],
    *,
    progress: bool = True,
    log=print,
) -> dict:
    """The results of an experiment that compares ``variants``: train each, measure the mass of
    those with scalar heads (:func:`measure_mass`), draw the validation curves (``val_loss.png``,
    ``title``, ``captions[0]`` followed by ``expectation(results, scale)``, the seed's expectation
    judged on the results) and the masses (``mass.png``, ``captions[1]``)."""
    results = {}
    for variant in variants:
        trained = train_variant(variant, settings, out, progress=progress, log=log)
        results[variant.name] = summary(variant, trained)
        if variant.model.get("attention", "standard") != "standard":
            results[variant.name]["mass_captured"] = measure_mass(trained.run_dir, settings)
    run = settings.scale
    caption = f"{captions[0]} {expectation(results, run)}"
    figures = [
        plot_val_curves(results, out, "val_loss.png", title, caption, run=run),
        plot_mass(results, out, "mass.png", "Mass on the k nearest scalar keys", captions[1], run=run),
    ]
    return dict(variants=results, mass_ks=list(MASS_KS), figures=figures)


def run_path(out: Path, variant: Variant) -> Path:
    return Path(out) / "runs" / variant.name


def summary(variant: Variant, trained: TrainResult) -> dict:
    """What ``results.json`` records of every trained variant: its label, run, final losses (nats
    per token) and validation curve."""
    return dict(
        label=variant.label,
        run=str(trained.run_dir),
        val_loss=trained.val_loss,
        train_loss=trained.train_loss,
        unigram_loss=trained.unigram_loss,
        val_curve=val_curve(trained.run_dir),
    )


def metric_curve(run_dir: Path, key: str) -> dict[str, list]:
    """``{"steps": [...], key: [...]}``: every logged value of ``key`` in the run's ``metrics.jsonl``."""
    records = [r for r in read_metrics(Path(run_dir) / METRICS_JSONL) if key in r]
    return {"steps": [r["step"] for r in records], key: [r[key] for r in records]}


def val_curve(run_dir: Path) -> dict[str, list]:
    """The validation loss (nats per token) at each evaluation of the run."""
    return metric_curve(run_dir, "val_loss")


def validation_windows(run: TrainedRun, run_dir: Path, length: int, count: int, seed: int) -> Tensor:
    """``(n, length)`` tokens: up to ``count`` windows of the run's validation split, each inside one
    document (chosen by ``seed``, as ``priorattn eval ppl`` chooses them)."""
    from ...eval.jobs import eval_documents
    from ...eval.ppl import pick_windows

    windows = pick_windows(eval_documents(run, Path(run_dir), None), length, count, seed)
    return torch.stack([torch.from_numpy(w[:length]) for w in windows])  # drop the last target


def scalar_layers(model: GPT) -> list[ScalarMultiheadAttention]:
    """The model's scalar attention layers, first block first (a mixed block's scalar heads)."""
    return [m for m in model.modules() if isinstance(m, ScalarMultiheadAttention)]


@torch.no_grad()
def scalar_layer_inputs(
    model: GPT, tokens: Tensor
) -> list[tuple[ScalarMultiheadAttention, Tensor, Tensor | None]]:
    """Run ``model`` on the windows ``tokens (B, L)`` (positions from 0, no documents); every scalar
    layer, first block first, with its input ``x (B, L, d_model)`` and the positions it was given."""
    layers = scalar_layers(model)
    if not layers:
        raise ValueError(
            "the model has no scalar heads: train it with attention='scalar', 'hybrid' or 'mixed'"
        )
    inputs = {}

    def keep_input(layer, args, kwargs):
        inputs[layer] = (args[0], kwargs.get("positions"))

    hooks = [layer.register_forward_pre_hook(keep_input, with_kwargs=True) for layer in layers]
    try:
        model.eval()
        model(tokens)
    finally:
        for hook in hooks:
            hook.remove()
    return [(layer, *inputs[layer]) for layer in layers]


@torch.no_grad()
def attention_maps(model: GPT, tokens: Tensor) -> list[ScalarAttentionMap]:
    """The dense attention of every scalar layer of ``model`` over the windows ``tokens (B, L)``
    (positions from 0, no documents), first block first."""
    return [
        layer.attention_map(x, positions=positions)
        for layer, x, positions in scalar_layer_inputs(model, tokens)
    ]


def mass_captured(maps: Sequence[ScalarAttentionMap], ks: Sequence[int] = MASS_KS) -> dict[int, float]:
    """For each ``k``: the mean fraction of attention mass on the ``k`` keys nearest each query in
    scalar distance ``|q_s - k_s|`` (what a sorted cache read with a window of ``k`` keys, seed 002
    "Binary Search at Inference"), plus the sink's (always read), so ``1 - mass`` is the window's
    approximation error. The mean is over layers, heads and the queries that see more than ``k``
    keys (a query that sees fewer is read whole). ``maps`` are of causal windows from position 0,
    as :func:`attention_maps` makes them. A ``k`` no query exceeds gives NaN."""
    return _mass_on_first(maps, ks, lambda m, h: m.distance()[:, h])


def heaviest_mass(maps: Sequence[ScalarAttentionMap], ks: Sequence[int] = MASS_KS) -> dict[int, float]:
    """As :func:`mass_captured`, on each query's ``k`` heaviest keys: the most any ``k`` keys
    capture, the ceiling of a sorted cache's window of ``k``."""
    return _mass_on_first(maps, ks, lambda m, h: -m.weights[:, h])


def recent_mass(maps: Sequence[ScalarAttentionMap], ks: Sequence[int] = MASS_KS) -> dict[int, float]:
    """As :func:`mass_captured`, on each query's ``k`` most recent keys (itself included): what a
    sliding window of ``k`` keys holds, the cache a positional prior such as GOAT's favours."""

    def lag(m: ScalarAttentionMap, h: int) -> Tensor:
        L = m.weights.shape[-1]
        lags = torch.arange(L)[:, None] - torch.arange(L)[None, :]  # i - j
        return lags.to(m.weights.dtype).expand(m.weights.shape[0], L, L)

    return _mass_on_first(maps, ks, lag)


def chance_mass(length: int, ks: Sequence[int] = MASS_KS) -> dict[int, float]:
    """As :func:`mass_captured` (without a sink) for ``k`` keys picked at random: query ``i`` of a
    causal window of ``length`` sees ``i + 1`` keys, so it expects ``k / (i + 1)`` of its mass."""
    return {
        k: sum(k / (i + 1) for i in range(k, length)) / (length - k) if k < length else math.nan for k in ks
    }


def _mass_on_first(maps: Sequence[ScalarAttentionMap], ks: Sequence[int], order) -> dict[int, float]:
    """The mean mass on the first ``k`` visible keys of each query by ``order(map, head) -> (B, L, L)``
    (ascending), plus the sink's, over layers, heads and the queries that see more than ``k`` keys."""
    ks = sorted(set(ks))
    if not ks or ks[0] < 1:
        raise ValueError(f"ks must be positive key counts, got {ks}")
    sums, counts = dict.fromkeys(ks, 0.0), dict.fromkeys(ks, 0)
    for m in maps:
        B, H, L, _ = m.weights.shape
        future = torch.ones(L, L, dtype=torch.bool).triu(1)  # key j > query i
        k_max = min(ks[-1], L)
        for h in range(H):  # one head at a time: L x L per window
            first = order(m, h).masked_fill(future, math.inf).topk(k_max, dim=-1, largest=False).indices
            captured = m.weights[:, h].gather(-1, first).cumsum(-1)  # (B, L, k_max)
            if m.sink_weight is not None:
                captured = captured + m.sink_weight[:, h, :, None]
            for k in ks:
                if k < L:  # queries i >= k see i + 1 > k keys
                    sums[k] += float(captured[:, k:, k - 1].double().sum())
                    counts[k] += B * (L - k)
    return {k: sums[k] / counts[k] if counts[k] else math.nan for k in ks}


def measure_mass(
    run_dir: Path, settings: Settings, ks: Sequence[int] = MASS_KS
) -> dict[str, dict[str, float]]:
    """:func:`mass_summary` of the run's scalar heads on its :func:`window_maps`."""
    return mass_summary(window_maps(run_dir, settings), ks)


def window_maps(run_dir: Path, settings: Settings) -> list[ScalarAttentionMap]:
    """The :func:`attention_maps` of the run's model on ``settings.windows`` validation windows of
    the training length."""
    run = load_run(run_dir)
    tokens = validation_windows(run, run_dir, settings.seq_len, settings.windows, settings.seed)
    return attention_maps(run.model, tokens)


def mass_summary(
    maps: Sequence[ScalarAttentionMap], ks: Sequence[int] = MASS_KS
) -> dict[str, dict[str, float]]:
    """The mass on the ``k`` nearest keys in scalar distance (``"nearest"``, :func:`mass_captured`),
    on the ``k`` heaviest (``"heaviest"``, the ceiling), the ``k`` most recent (``"recent"``) and ``k``
    random ones (``"chance"``), each keyed by ``str(k)`` as JSON keys are."""
    length = maps[0].weights.shape[-1]
    masses = dict(
        nearest=mass_captured(maps, ks),
        heaviest=heaviest_mass(maps, ks),
        recent=recent_mass(maps, ks),
        chance=chance_mass(length, ks),
    )
    return {name: {str(k): mass for k, mass in by_k.items()} for name, by_k in masses.items()}


def plot_val_curves(
    variants: dict[str, dict], out: Path, name: str, title: str, caption: str, *, run: RunScale
) -> str:
    """The validation curves of :func:`summary` entries as ``out/NAME``: every evaluation (left,
    with the unigram baseline) and the second half of training, zoomed (right); its name. ``run``:
    the experiment's budget and steps, above the panels."""
    from ...figures import captioned_figure

    fig, panel = captioned_figure((11, 4.4), caption, run=run)
    whole, late = panel.subplots(1, 2)
    for entry in variants.values():
        steps, losses = entry["val_curve"]["steps"], entry["val_curve"]["val_loss"]
        whole.plot(steps, losses, marker="o", markersize=3, label=entry["label"])
        half = len(steps) // 2
        late.plot(steps[half:], losses[half:], marker="o", markersize=3, label=entry["label"])
    baseline = next(iter(variants.values()))["unigram_loss"]
    whole.axhline(
        baseline, color="0.4", linestyle="--", linewidth=1, label=f"unigram baseline ({baseline:.3f})"
    )
    for ax, part in ((whole, "every evaluation"), (late, "second half, zoomed")):
        ax.set(xlabel="training step", ylabel="validation loss (nats per byte)", title=part)
        ax.grid(alpha=0.3)
    whole.legend(fontsize=8)
    panel.suptitle(title)
    return save_figure(fig, out, name)


def plot_mass(
    variants: dict[str, dict], out: Path, name: str, title: str, caption: str, *, run: RunScale
) -> str:
    """The :func:`measure_mass` (``"mass_captured"``) of the entries that have it against k, as
    ``out/NAME``: nearest keys solid, heaviest dotted in the same colour, random keys grey; its name."""
    from ...figures import captioned_figure

    lines = (
        "Solid: the k keys nearest each query in scalar distance |q_s - k_s|, what a sorted cache "
        "reading k keys holds. Dotted, same colour: the k heaviest keys, the most any k keys hold. "
        "Grey: k keys at random."
    )
    fig, panel = captioned_figure((6.5, 4.4), f"{caption} {lines}", run=run)
    ax = panel.subplots()
    for entry in variants.values():
        if "mass_captured" in entry:
            mass = entry["mass_captured"]
            ks = [int(k) for k in mass["nearest"]]
            (line,) = ax.plot(ks, list(mass["nearest"].values()), marker="o", label=entry["label"])
            ax.plot(ks, list(mass["heaviest"].values()), linestyle=":", color=line.get_color())
    ax.plot(ks, list(mass["chance"].values()), linestyle="--", color="0.5", label="k keys at random")
    ax.plot([], [], linestyle=":", color="0.3", label="k heaviest keys (the ceiling)")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="k: keys read", ylabel="attention mass captured", title=title)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, out, name)


def save_figure(fig, out: Path, name: str) -> str:
    """Save ``fig`` as ``out/NAME``; the name, as ``results.json`` lists its figures."""
    from ...figures import save

    save(fig, Path(out) / name)
    return name
