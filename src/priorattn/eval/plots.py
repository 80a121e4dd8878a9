"""Pictures of evaluation results, one model or several side by side.

Every function takes ``results: {label: result dict}`` (what :func:`~priorattn.eval.evaluate_ppl`
or :func:`~priorattn.eval.evaluate_retrieval` return) and writes one PNG.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator, ScalarFormatter

from ..analysis.plots import save


def mark_train_len(ax, train_lens: set[int]) -> None:
    for T in sorted(train_lens):
        ax.axvline(T, color="0.5", linestyle=":", linewidth=1)


def length_axis(ax, lengths: list[int]) -> None:
    """A log-x axis labelled at the evaluated lengths themselves."""
    ax.set_xscale("log")
    ax.set_xticks(lengths, [str(n) for n in lengths], rotation=45)
    ax.xaxis.set_minor_locator(NullLocator())


def plot_ppl(results: dict[str, dict], path: Path) -> Path:
    """Perplexity against evaluation length (log-x, log-y), the paired delta with its standard error,
    and the loss by token position at the longest length (seed 003 Fig. 6)."""
    fig = Figure(figsize=(15, 4.4), layout="constrained")
    ppl_ax, delta_ax, pos_ax = fig.subplots(1, 3)
    train_lens = {r["train_len"] for r in results.values()}
    for label, r in results.items():
        ppl_ax.plot(r["lengths"], r["ppl"], marker="o", label=label)
        paired = [
            (n, d, se or 0.0) for n, d, se in zip(r["lengths"], r["paired_delta"], r["paired_delta_se"])
        ]
        paired = [p for p in paired if p[1] is not None]
        if paired:
            n, d, se = zip(*paired)
            delta_ax.errorbar(n, d, yerr=se, marker="o", capsize=3, label=label)
        longest = r["position_loss"][-1]
        edges = np.asarray(longest["edges"], dtype=float)
        centres = np.sqrt(edges[:-1] * np.maximum(edges[1:] - 1, edges[:-1]))  # geometric bin centres
        pos_ax.plot(centres, longest["loss"], marker=".", label=label)
    lengths = sorted({n for r in results.values() for n in r["lengths"]})
    ppl_ax.set(yscale="log", xlabel="evaluation length (tokens)", ylabel="perplexity")
    ppl_ax.yaxis.set_major_formatter(ScalarFormatter())
    ppl_ax.yaxis.set_minor_formatter(ScalarFormatter())
    ppl_ax.set_title("perplexity vs length")
    delta_ax.axhline(0, color="0.3", linewidth=1)
    delta_ax.set(xlabel="evaluation length (tokens)", ylabel="nats / token")
    delta_ax.set_title("paired delta: long context minus short (< 0 helps)")
    for ax in (ppl_ax, delta_ax):
        length_axis(ax, lengths)
    pos_ax.set(xscale="log", xlabel="token position", ylabel="mean loss (nats / token)")
    pos_ax.set_title(f"loss by position, windows of {lengths[-1]} tokens")
    for ax in (ppl_ax, delta_ax, pos_ax):
        mark_train_len(ax, train_lens)
        ax.grid(alpha=0.3, which="both")
    ppl_ax.legend(fontsize=8)
    return save(fig, Path(path))


def plot_retrieval_heatmaps(results: dict[str, dict], path: Path, title: str = "") -> Path:
    """Accuracy heatmaps over length (x) and depth (y), one per model, with the mean over depths
    in the bottom row and over lengths in the last column (seed 003 Fig. 3)."""
    n = len(results)
    fig = Figure(figsize=(4.2 * n + 0.8, 4.6), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, n, sharey=True))
    image = None
    for ax, (label, r) in zip(axes, results.items()):
        acc = np.asarray(r["accuracy"]).T  # (depths, lengths)
        grid = np.full((acc.shape[0] + 1, acc.shape[1] + 1), np.nan)
        grid[:-1, :-1] = acc
        grid[-1, :-1] = acc.mean(0)
        grid[:-1, -1] = acc.mean(1)
        grid[-1, -1] = acc.mean()
        image = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
        ax.axhline(acc.shape[0] - 0.5, color="k", linewidth=1.5)
        ax.axvline(acc.shape[1] - 0.5, color="k", linewidth=1.5)
        ax.set_xticks(range(acc.shape[1] + 1), [str(x) for x in r["lengths"]] + ["mean"], rotation=45)
        ticks = list(range(0, acc.shape[0], max(1, acc.shape[0] // 5)))
        ax.set_yticks(ticks + [acc.shape[0]], [f"{r['depths'][i]:.2f}" for i in ticks] + ["mean"])
        ax.set_title(f"{label}: {acc.mean():.2f}")
        ax.set_xlabel("context length (tokens)")
    axes[0].set_ylabel("needle depth")
    fig.colorbar(image, ax=axes, shrink=0.8, label="accuracy")
    if title:
        fig.suptitle(title)
    return save(fig, Path(path))


def plot_accuracy_vs_length(results: dict[str, dict], path: Path, title: str = "accuracy") -> Path:
    """Mean accuracy over depths against length, one line per model (log-x)."""
    fig = Figure(figsize=(6.5, 4.2), layout="constrained")
    ax = fig.subplots()
    for label, r in results.items():
        ax.plot(r["lengths"], r["by_length"], marker="o", label=label)
    length_axis(ax, sorted({n for r in results.values() for n in r["lengths"]}))
    mark_train_len(ax, {r["train_len"] for r in results.values() if "train_len" in r})
    ax.set(ylim=(-0.03, 1.03), xlabel="context length (tokens)", ylabel="accuracy")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return save(fig, Path(path))
