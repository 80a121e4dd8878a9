"""Seed 002 experiment 2: scalar distance ``|q_s - k_s|`` against attention weight, with and without
``L_align`` ("For each (q,k) pair sorted by combined attention weight, plot |qs - ks|. If alignment
regularizer is working, high-weight pairs should have small scalar distance.").

Distances are measured in standard deviations of the head's keys over the windows: ``L_align``
alone is also lowered by shrinking every scalar (seed 002 "Term 2": "minimized trivially if all
scalar keys collapse"), which a raw distance would count as alignment. Locality is summarized by
two numbers that no rescaling of the scalars changes:

- ``rank_correlation``: Spearman's correlation between a query's weights and its keys' scalar
  distances, over the keys it sees, averaged over queries; -1 when weight falls with distance
  alone (pure scalar heads without a sink: the weight is ``exp(-d^2 / tau)`` up to the row's
  normalizer), 0 when the scalar term says nothing about where the weight goes.
- ``nearest_mass[k]``: the mass on each query's ``k`` nearest keys in scalar distance (what a
  sorted cache's window of ``k`` reads), averaged over queries that see more than ``k`` keys (for
  ``k`` below the window length).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ...figures import RunScale, captioned_figure, save, seed_expectation
from ...scalar.layers import ScalarAttentionMap
from . import regularizer_ablation
from .common import (
    Settings,
    Variant,
    attention_maps,
    load_run,
    mass_captured,
    summary,
    train_variant,
    validation_windows,
)
from .hybrid_vs_standard import VARIANTS as EXPERIMENT_1

HYBRID = next(v for v in EXPERIMENT_1 if v.name == "hybrid")  # no regularizer
#: A ten times stronger L_align than experiment 3's: does locality keep improving with the weight?
STRONG_ALIGN = 10 * regularizer_ablation.ALIGN


def variants(settings: Settings) -> list[Variant]:
    """The hybrid without a regularizer, with experiment 3's ``L_align``, with it ten times stronger,
    and with experiment 3's three terms (``L_spread`` keeps the keys from collapsing)."""
    ablation = {v.name: v for v in regularizer_ablation.variants(settings)}
    strong = dict(reg_align=STRONG_ALIGN)
    return [
        HYBRID,
        replace(ablation["align"], label=f"hybrid + L_align (weight {regularizer_ablation.ALIGN:g})"),
        Variant(
            "align_x10",
            f"hybrid + L_align (weight {STRONG_ALIGN:g})",
            dict(attention="hybrid"),
            options=strong,
        ),
        replace(ablation["all"], label="hybrid + L_align + L_spread + L_tau"),
    ]


#: Window sizes at which the nearest-key mass is reported.
NEAREST_KS = (1, 2, 4, 8, 16, 32, 64)
#: A query enters the rank correlation only if it sees at least this many keys.
MIN_KEYS = 8
#: Weights below this are drawn at it in the scatter (log scale).
WEIGHT_FLOOR = 1e-8


def rank_correlation(weights: Tensor, distances: Tensor) -> Tensor:
    """Spearman's correlation of weight and distance over each row's visible keys (``distances`` is
    ``inf`` where a key is not visible): ``(...)`` for ``(..., L)`` inputs, NaN for rows with fewer
    than 2 visible keys. Ties are ranked in index order."""
    visible = torch.isfinite(distances)
    n = visible.sum(-1, keepdim=True).double()
    # Hidden keys rank last in both orders, so the visible keys of a row hold ranks 0 .. n - 1.
    rank_w = weights.masked_fill(~visible, torch.inf).argsort(dim=-1, stable=True).argsort(-1).double()
    rank_d = distances.argsort(dim=-1, stable=True).argsort(-1).double()
    centre = (n - 1) / 2
    covariance = ((rank_w - centre) * (rank_d - centre) * visible).sum(-1, keepdim=True) / n
    variance = (n * n - 1) / 12
    return (covariance / variance).squeeze(-1)


def causal_distances(attention: ScalarAttentionMap) -> Tensor:
    """``|q_s,i - k_s,j|`` ``(B, H, L, L)`` float64 of a map of causal windows from position 0 (as
    :func:`~.common.attention_maps` makes them), ``inf`` for the keys after each query."""
    distance = attention.distance().double()
    L = distance.shape[-1]
    return distance.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), torch.inf)


def layer_alignment(attention: ScalarAttentionMap) -> dict:
    """The rank correlation of one layer (mean over windows, heads and queries that see at least
    :data:`MIN_KEYS` keys), ``L_align`` as the regularizer computes it (``mean_queries sum_j w_ij
    d_ij^2``, key mass only), the keys' standard deviation and the mean tau."""
    weights, distances = attention.weights.double(), causal_distances(attention)
    seen = torch.isfinite(distances).sum(-1)  # (B, H, L) keys each query sees
    finite = torch.where(torch.isfinite(distances), distances, 0.0)
    return dict(
        rank_correlation=float(rank_correlation(weights, distances)[seen >= MIN_KEYS].mean()),
        l_align=float((weights * finite**2).sum(-1).mean()),
        key_std=float(attention.k_s.double().std(dim=(0, 2)).mean()),
        tau=float(attention.tau.double().mean()),
    )


def alignment_summary(maps: Sequence[ScalarAttentionMap], ks: Sequence[int] = NEAREST_KS) -> dict:
    """``{"layers": [layer_alignment, ...]}``, their means over layers under the same names, and
    ``nearest_mass`` (:func:`~.common.mass_captured`) for the ``ks`` below the window length."""
    layers = [layer_alignment(m) for m in maps]
    mean = {name: float(np.mean([layer[name] for layer in layers])) for name in layers[0]}
    length = maps[0].weights.shape[-1]
    masses = mass_captured(maps, [k for k in ks if k < length])
    return dict(mean, nearest_mass={str(k): mass for k, mass in masses.items()}, layers=layers)


def weight_distance_pairs(maps: Sequence[ScalarAttentionMap]) -> tuple[np.ndarray, np.ndarray]:
    """Every visible (query, key) pair of every layer and head: ``(weight, |q_s - k_s| / key std)``."""
    weights, distances = [], []
    for attention in maps:
        d = causal_distances(attention)
        std = attention.k_s.double().std(dim=(0, 2))[None, :, None, None]  # per head
        visible = torch.isfinite(d)
        weights.append(attention.weights.double()[visible].numpy())
        distances.append((d / std)[visible].numpy())
    return np.concatenate(weights), np.concatenate(distances)


def binned_median(x: np.ndarray, y: np.ndarray, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Centres of the ``edges`` bins of ``x`` that hold points, and the median ``y`` in each."""
    which = np.digitize(x, edges) - 1
    centres, medians = [], []
    for b in range(len(edges) - 1):
        inside = which == b
        if inside.any():
            centres.append((edges[b] + edges[b + 1]) / 2)
            medians.append(float(np.median(y[inside])))
    return np.array(centres), np.array(medians)


#: The window at which the nearest-key mass judges the seed's expectation.
JUDGED_K = "8"


def expectation(measured: dict[str, dict], run: RunScale) -> str:
    """Seed 002 experiment 2, judged on the hybrid with experiment 3's ``L_align`` (``"align"``)
    against the hybrid without (``"hybrid"``): with ``L_align`` working, weight falls more with
    scalar distance (a lower rank correlation rho) and the nearest keys hold more of the mass."""
    without, with_align = measured["hybrid"]["alignment"], measured["align"]["alignment"]
    mass = [a["nearest_mass"].get(JUDGED_K) for a in (without, with_align)]
    rho = [a["rank_correlation"] for a in (without, with_align)]
    agrees = None if None in mass else rho[1] < rho[0] and mass[1] > mass[0]
    masses = "not measured" if None in mass else f"{mass[0]:.3f} -> {mass[1]:.3f}"
    return seed_expectation(
        "Seed 002 expects that with the alignment regularizer L_align working, high-weight pairs sit "
        "at small scalar distance: the median line falls to the right and the nearest keys hold more "
        "of the mass.",
        agrees,
        f"with L_align ({regularizer_ablation.ALIGN:g}) rho goes from {rho[0]:.3f} to {rho[1]:.3f} "
        f"and the {JUDGED_K} nearest keys' mass from {masses}",
        run,
    )


def plot_alignment(
    drawn: dict[str, tuple[np.ndarray, np.ndarray, dict]], out: Path, expectation: str, *, run: RunScale
) -> Path:
    """``alignment.png``: per setting (name -> ``(weights, distances, summary)``), a 2D histogram of
    scalar distance against attention weight with its binned median, and the nearest-key mass
    against the window size for every setting; the caption ends with ``expectation``."""
    from matplotlib.colors import LogNorm

    caption = (
        "Histograms, one per training setting: every (query, key) pair a query sees, in every scalar "
        "layer and head, on validation windows at the training length. Across: the pair's attention "
        f"weight (log scale; below {WEIGHT_FLOOR:g} drawn at it). Up: the scalar distance |q_s - k_s| "
        "in standard deviations of the head's keys (so shrinking every scalar does not count as "
        "alignment). Colour: how many pairs fall in the cell. White line: the median distance at each "
        "weight. Last panel: the attention mass that the k keys nearest the query in scalar distance hold "
        "(what a sorted cache's window of k keys reads), averaged over queries that see more than k "
        "keys.\n\n"
        "rho is Spearman's rank correlation between weight and distance (-1: weight falls with "
        f"distance alone). {expectation}"
    )
    columns = 3
    rows = -(-(len(drawn) + 1) // columns)  # the histograms, then the mass panel
    fig, panel = captioned_figure((6.0 * columns, 5.0 * rows), caption, run=run)
    axes = panel.subplots(rows, columns, squeeze=False).flatten()
    for spare in axes[len(drawn) + 1 :]:
        spare.set_visible(False)
    x_edges = np.linspace(np.log10(WEIGHT_FLOOR), 0.0, 61)
    top = max(np.quantile(d, 0.999) for _, d, _ in drawn.values())
    y_edges = np.linspace(0.0, top, 61)
    for ax, (name, (weights, distances, measured)) in zip(axes, drawn.items()):
        x = np.log10(np.maximum(weights, WEIGHT_FLOOR))
        counts, _, _ = np.histogram2d(x, distances, bins=(x_edges, y_edges))
        image = ax.pcolormesh(x_edges, y_edges, counts.T, norm=LogNorm(vmin=1), cmap="viridis")
        centres, medians = binned_median(x, distances, x_edges)
        ax.plot(centres, medians, color="white", lw=2, label="median distance")
        ax.set_xlabel("attention weight of the pair (log10)")
        ax.set_ylabel("scalar distance |q_s - k_s| (key standard deviations)")
        ax.set_title(
            f"{name}\nrho = {measured['rank_correlation']:.3f}, L_align = {measured['l_align']:.3g}",
            fontsize=10,
        )
        ax.legend(loc="upper right", fontsize=8, facecolor="0.7")
        panel.colorbar(image, ax=ax, label="pairs in the cell")
    ax = axes[len(drawn)]
    for name, (_, _, measured) in drawn.items():
        ks = [int(k) for k in measured["nearest_mass"]]
        ax.plot(ks, [measured["nearest_mass"][str(k)] for k in ks], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("k: keys nearest the query in scalar distance")
    ax.set_ylabel("attention mass on those k keys")
    ax.set_title("Mass a sorted-cache window of k keys would read", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    panel.suptitle("Do high-weight pairs sit close in scalar space? (seed 002 experiment 2)")
    return save(fig, out / "alignment.png")


def run(settings: Settings, out: Path, *, progress: bool = True, log=print) -> dict:
    """Train the hybrid without and with ``L_align``; measure and draw each on validation windows."""
    measured, drawn = {}, {}
    for variant in variants(settings):
        trained = train_variant(variant, settings, out, progress=progress, log=log)
        model_run = load_run(trained.run_dir)
        tokens = validation_windows(
            model_run, trained.run_dir, settings.seq_len, settings.windows, settings.seed
        )
        maps = attention_maps(model_run.model, tokens)
        measured[variant.name] = summary(variant, trained) | dict(alignment=alignment_summary(maps))
        drawn[variant.label] = (*weight_distance_pairs(maps), measured[variant.name]["alignment"])
    figure = plot_alignment(drawn, out, expectation(measured, settings.scale), run=settings.scale)
    return dict(variants=measured, figures=[figure.name])
