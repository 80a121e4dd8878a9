"""Seed 002 experiment 5: the scalar sink token ("Add a learned sink token with fixed ks = 0. Measure
whether it absorbs garbage mass and whether tau dynamics change").

The seed's picture ("Attention Sinks and Token Disposal"): without a sink, a query with no relevant
key near its scalar still puts all its mass on whatever keys are nearest; a sink at ``k_s = 0`` with
a learned (neutral) value gives that mass a harmless place, and "query projections learn to map
unfocused queries toward qs ~ 0". Measured on validation windows:

- ``sink_mass``: the sink's attention weight per layer, head and query position, and at lengths
  beyond the training length (a key that every query sees competes with more keys as the context
  grows);
- garbage mass: the sink's weight against the distance from the query to its nearest real key, in
  bandwidths ``sqrt(tau)``: a sink that absorbs garbage takes the mass of queries with no key near;
- ``queries_near_sink``: the fraction of queries within one bandwidth of the sink's key (also
  measured on a model without a sink, at ``k_s = 0``, for comparison).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ...eval.ppl import position_bins
from ...figures import RunScale, captioned_figure, save, seed_expectation
from .alignment import HYBRID
from .capture import ScalarLayerCapture, capture_scalar_layers
from .common import Settings, Variant, load_run, metric_curve, summary, train_variant, validation_windows
from .hybrid_vs_standard import VARIANTS as EXPERIMENT_1

SCALAR = next(v for v in EXPERIMENT_1 if v.name == "scalar")  # pure scalar, no sink
VARIANTS = (
    SCALAR,
    Variant("scalar-sink", "pure scalar + sink", dict(attention="scalar"), options=dict(sink=True)),
    HYBRID,
    Variant("hybrid-sink", "hybrid + sink", dict(attention="hybrid"), options=dict(sink=True)),
)
#: Validation windows per length.
WINDOWS = 2

#: Query rows per block when weights are computed for long windows.
ROWS_PER_BLOCK = 256
#: Edges of the nearest-key distance bins, in bandwidths ``sqrt(tau)``.
DISTANCE_EDGES = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, np.inf)


def row_blocks(length: int) -> list[Tensor]:
    return [
        torch.arange(start, min(start + ROWS_PER_BLOCK, length)) for start in range(0, length, ROWS_PER_BLOCK)
    ]


def sink_mass(capture: ScalarLayerCapture) -> Tensor:
    """The sink's attention weight ``(B, H, L)`` float64 of every query (the sink's column of the
    dense softmax), computed a block of rows at a time."""
    if capture.layer.sink_value is None:
        raise ValueError("the model has no sink: train it with the option sink=True (--scalar-sink)")
    return torch.cat([capture.weights(rows)[1] for rows in row_blocks(capture.length)], dim=-1)


def nearest_key_distance(capture: ScalarLayerCapture) -> Tensor:
    """Distance from each query's scalar to its nearest visible key's, in bandwidths ``sqrt(tau)``:
    ``(B, H, L)`` float64."""
    nearest = torch.cat([capture.distances(rows).amin(-1) for rows in row_blocks(capture.length)], dim=-1)
    return nearest / capture.tau.double().sqrt()


def queries_near_sink(capture: ScalarLayerCapture) -> float:
    """The fraction of queries within one bandwidth of the sink's key (``k_s = 0`` without a sink)."""
    tau = capture.tau.double()
    return float(((capture.q_s.double() - capture.layer.sink_key).abs() < tau.sqrt()).double().mean())


def binned_means(x: Tensor, y: Tensor, edges: Sequence[float]) -> list[float | None]:
    """The mean of ``y`` over the entries whose ``x`` falls in each bin ``[edges[i], edges[i+1])``
    (``None`` for an empty bin)."""
    means = []
    for low, high in zip(edges[:-1], edges[1:]):
        inside = (x >= low) & (x < high)
        means.append(float(y[inside].mean()) if inside.any() else None)
    return means


def sink_summary(captures: Sequence[ScalarLayerCapture]) -> dict:
    """Sink mass per layer and head, by query position (bins ``[2^k, 2^(k+1))`` of position + 1) and
    by nearest-key distance (:data:`DISTANCE_EDGES`), and the fraction of queries near the sink."""
    masses = [sink_mass(c) for c in captures]
    distances = [nearest_key_distance(c) for c in captures]
    L = captures[0].length
    positions = torch.arange(1, L + 1).expand_as(masses[0])
    all_mass = torch.stack(masses)
    return dict(
        mean=float(all_mass.mean()),
        layers=[
            dict(
                mean=float(m.mean()),
                heads=m.mean(dim=(0, 2)).tolist(),
                queries_near_sink=queries_near_sink(c),
            )
            for c, m in zip(captures, masses)
        ],
        position_edges=position_bins(L),
        by_position=binned_means(torch.stack([positions] * len(masses)), all_mass, position_bins(L)),
        distance_edges=[e if np.isfinite(e) else None for e in DISTANCE_EDGES],
        by_nearest_distance=binned_means(torch.stack(distances), all_mass, DISTANCE_EDGES),
        queries_near_sink=float(np.mean([queries_near_sink(c) for c in captures])),
    )


@torch.no_grad()
def sink_by_length(model, windows_at: Callable[[int], Tensor], lengths: Sequence[int]) -> list[dict]:
    """:func:`sink_summary` on the windows ``windows_at(length)`` (tokens ``(B, length)``) of each
    length: ``[{"length", ...}]``."""
    return [
        dict(length=length) | sink_summary(capture_scalar_layers(model, windows_at(length)))
        for length in lengths
    ]


def expectation(by_length: dict[str, list[dict]], run: RunScale) -> str:
    """Seed 002's picture of the sink, judged on each sink model's share by nearest-key distance at
    the training length (``by_length``: name -> :func:`sink_by_length` records): it absorbs garbage
    mass when it takes more of the attention of queries with no key near (the farthest bin that
    holds queries) than of queries with a key near (the nearest such bin)."""
    shares = {}
    for name, records in by_length.items():
        held = [v for v in records[0]["by_nearest_distance"] if v is not None]
        shares[name] = (held[0], held[-1])
    measured = "; ".join(
        f"{name}: {near:.3f} of the attention of queries with a key near, {far:.3f} of those farthest"
        for name, (near, far) in shares.items()
    )
    return seed_expectation(
        "Seed 002 expects the sink to absorb garbage mass: to take the attention of queries with no "
        "key near ((c) rising to the right).",
        all(far > near for near, far in shares.values()) if shares else None,
        measured or "no model with a sink",
        run,
    )


def plot_sink(
    by_length: dict[str, list[dict]],
    tau_curves: dict[str, tuple[list[int], list[float]]],
    out: Path,
    *,
    run: RunScale,
) -> Path:
    """``sink.png``: for each model with a sink (``by_length``: name -> :func:`sink_by_length`
    records, the first at the training length), its mass per layer and head, by query position at
    every length and by nearest-key distance; and the mean tau over training of every model
    (``tau_curves``: name -> ``(steps, mean tau)``). The caption judges the seed's picture
    (:func:`expectation`)."""
    caption = (
        "Models trained with a sink key at scalar 0 (seed 002 'Attention Sinks': a persistent key every "
        "query sees, with a learned value), measured on validation windows. (a) The sink's share of "
        "each head's attention at the training length, averaged over queries. (b) The sink's share by "
        "query position (bins of doubling width), at the training length and beyond it: a query far "
        "into a long window sees many more keys competing with the sink. (c) The sink's share against "
        "the distance from the query to its nearest real key, in bandwidths sqrt(tau): if the sink "
        "absorbs 'garbage' mass it takes the attention of queries with no key near them. (d) The mean "
        "learned bandwidth tau over training, with and without a sink.\n\n"
        f"{expectation(by_length, run)} The seed also asks whether tau grows differently when a "
        "sink exists: compare the lines of (d)."
    )
    fig, panel = captioned_figure((15, 10), caption, run=run)
    (ax_heads, ax_position), (ax_distance, ax_tau) = panel.subplots(2, 2)
    names = list(by_length)
    width = 0.8 / max(len(names), 1)
    colour = {name: f"C{i}" for i, name in enumerate(dict.fromkeys([*tau_curves, *names]))}  # one per model
    for c, name in enumerate(names):
        records = by_length[name]
        heads = [h for layer in records[0]["layers"] for h in layer["heads"]]
        ax_heads.bar(np.arange(len(heads)) + c * width, heads, width, color=colour[name], label=name)
        for s, record in enumerate(records):
            edges = record["position_edges"]
            centres = [
                np.sqrt(low * (high - 1)) if high - 1 > low else low
                for low, high in zip(edges[:-1], edges[1:])
            ]
            kept = [(x, y) for x, y in zip(centres, record["by_position"]) if y is not None]
            style = dict(color=colour[name], ls=("-", "--", ":", "-.")[s % 4], marker="o", ms=3)
            ax_position.plot(*zip(*kept), label=f"{name}, windows of {record['length']}", **style)
        edges = records[0]["distance_edges"]
        labels = [
            f"{low:g}-{high:g}" if high is not None else f">{low:g}"
            for low, high in zip(edges[:-1], edges[1:])
        ]
        values = [np.nan if v is None else v for v in records[0]["by_nearest_distance"]]
        ax_distance.bar(np.arange(len(labels)) + c * width, values, width, color=colour[name], label=name)
        ax_distance.set_xticks(np.arange(len(labels)) + width * (len(names) - 1) / 2, labels)
    heads_per_layer = len(by_length[names[0]][0]["layers"][0]["heads"]) if names else 1
    ax_heads.set_xlabel(f"head (layer by layer, {heads_per_layer} heads each)")
    ax_heads.set_ylabel("sink's share of the attention")
    ax_heads.set_title("(a) Sink mass per layer and head, at the training length", fontsize=10)
    ax_position.set_xscale("log", base=2)
    ax_position.set_xlabel("query position (tokens into the window)")
    ax_position.set_ylabel("sink's share of the attention")
    ax_position.set_title("(b) Sink mass by query position and window length", fontsize=10)
    ax_distance.set_xlabel("distance from the query to its nearest real key (bandwidths sqrt(tau))")
    ax_distance.set_ylabel("sink's share of the attention")
    ax_distance.set_title("(c) Does the sink take the mass of queries with no key near?", fontsize=10)
    for name, (steps, tau) in tau_curves.items():
        ax_tau.plot(steps, tau, color=colour[name], label=name)
    ax_tau.set_xlabel("training step")
    ax_tau.set_ylabel("mean tau over scalar layers and heads")
    ax_tau.set_title("(d) Bandwidth over training", fontsize=10)
    for ax in (ax_heads, ax_position, ax_distance, ax_tau):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    panel.suptitle("Where the scalar sink's attention comes from (seed 002 experiment 5)")
    return save(fig, out / "sink.png")


def run(settings: Settings, out: Path, *, progress: bool = True, log=print) -> dict:
    """Train pure scalar and hybrid models without and with a sink; measure the sinks at the training
    length and at 4 and 16 times it, and every model's tau over training."""
    lengths = [settings.seq_len * f for f in (1, 4, 16)]
    variants, by_length, tau_curves = {}, {}, {}
    for variant in VARIANTS:
        trained = train_variant(variant, settings, out, progress=progress, log=log)
        model_run = load_run(trained.run_dir)

        def windows_at(length: int, model_run=model_run, run_dir=trained.run_dir) -> Tensor:
            return validation_windows(model_run, run_dir, length, WINDOWS, settings.seed)

        tau = metric_curve(trained.run_dir, "tau")
        captures = capture_scalar_layers(model_run.model, windows_at(settings.seq_len))
        result = summary(variant, trained) | dict(
            tau_curve=tau, queries_near_sink=float(np.mean([queries_near_sink(c) for c in captures]))
        )
        if variant.options.get("sink"):
            result["sink"] = by_length[variant.label] = sink_by_length(model_run.model, windows_at, lengths)
        variants[variant.name] = result
        tau_curves[variant.label] = (tau["steps"], tau["tau"])
    figure = plot_sink(by_length, tau_curves, out, run=settings.scale)
    return dict(variants=variants, lengths=lengths, windows=WINDOWS, figures=[figure.name])
