"""Pictures of evaluation results, one model or several side by side.

Every function takes ``results: {label: result dict}`` (what :func:`~priorattn.eval.evaluate_ppl`
or :func:`~priorattn.eval.evaluate_retrieval` return) and writes one PNG, with a plain-language
title, axes in words and a caption under the panels (what is plotted, how to read it); ``run``, for
the figures of a study, the study run's budget and steps above the panels. The figures with a line
per model fit a report page's width (:data:`~priorattn.figures.PAGE_WIDTH`, text at
:data:`~priorattn.figures.LEGIBLE` sizes) and take ``styles``: ``{label: line keywords}``, one
colour, marker and line style per model (``compare`` gives each mechanism's,
:func:`priorattn.studies.styles.mechanism_style`); a label without one takes matplotlib's next.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.ticker import NullLocator, ScalarFormatter

from ..figures import PAGE_WIDTH, RunScale, captioned_figure, legible, save


def mark_train_len(ax, train_lens: set[int]) -> None:
    """A dotted vertical line at each model's training length, named once in the legend."""
    for k, T in enumerate(sorted(train_lens)):
        label = "training length" if k == 0 else None
        ax.axvline(T, color="0.5", linestyle=":", linewidth=1, label=label)


def length_axis(ax, lengths: list[int]) -> None:
    """A log-x axis labelled at the evaluated lengths themselves."""
    ax.set_xscale("log")
    ax.set_xticks(lengths, [str(n) for n in lengths], rotation=45)
    ax.xaxis.set_minor_locator(NullLocator())


def plot_ppl(
    results: dict[str, dict],
    path: Path,
    *,
    run: RunScale | None = None,
    styles: dict[str, dict] | None = None,
) -> Path:
    """Perplexity against evaluation length (log-x, log-y), the paired delta with its standard error,
    and the loss by token position at the longest length (seed 003 Fig. 6); one legend for all
    three."""
    with legible():
        return _plot_ppl(results, path, run, styles or {})


def _plot_ppl(results: dict[str, dict], path: Path, run: RunScale | None, styles: dict[str, dict]) -> Path:
    lengths = sorted({n for r in results.values() for n in r["lengths"]})
    caption = (
        "Top left: perplexity on held-out text (the exponential of the mean next-token loss; lower is "
        "better) against how many tokens the model reads at once. The dotted line is the training "
        "length: points right of it test inputs longer than any seen in training. A flat line "
        "copes with them; a rising one degrades.\n\n"
        "Top right: does the extra context help? The loss of the same final tokens read after the "
        "long context minus after a training-length context (error bars: one standard error over "
        "windows). Below 0 the extra context helps; above 0 it hurts; near 0 it is ignored.\n\n"
        f"Bottom: mean loss at each token position inside the {lengths[-1]}-token windows (positions "
        "grouped in bins that double in width). A model that fails beyond its training length rises "
        "right of the dotted line."
    )
    fig, panel = captioned_figure((PAGE_WIDTH, 7.6), caption, fontsize=11, run=run)
    (ppl_ax, delta_ax), (pos_ax, key) = panel.subplots(2, 2)
    train_lens = {r["train_len"] for r in results.values()}
    for i, (label, r) in enumerate(results.items()):
        style = dict(color=f"C{i}", marker="o") | styles.get(label, {})
        ppl_ax.plot(r["lengths"], r["ppl"], label=label, **style)
        paired = [
            (n, d, se or 0.0) for n, d, se in zip(r["lengths"], r["paired_delta"], r["paired_delta_se"])
        ]
        paired = [p for p in paired if p[1] is not None]
        if paired:
            n, d, se = zip(*paired)
            delta_ax.errorbar(n, d, yerr=se, capsize=3, label=label, **style)
        longest = r["position_loss"][-1]
        edges = np.asarray(longest["edges"], dtype=float)
        centres = np.sqrt(edges[:-1] * np.maximum(edges[1:] - 1, edges[:-1]))  # geometric bin centres
        pos_ax.plot(centres, longest["loss"], label=label, **style | dict(markersize=4))
    ppl_ax.set(yscale="log", xlabel="input length (tokens)", ylabel="perplexity (lower is better)")
    ppl_ax.yaxis.set_major_formatter(ScalarFormatter())
    ppl_ax.yaxis.set_minor_formatter(ScalarFormatter())
    ppl_ax.set_title("Perplexity as inputs get longer")
    delta_ax.axhline(0, color="0.3", linewidth=1)
    delta_ax.set(xlabel="input length (tokens)", ylabel="loss change, nats per token (< 0: helps)")
    delta_ax.set_title("Loss with long context minus with short")
    for ax in (ppl_ax, delta_ax):
        length_axis(ax, lengths)
    pos_ax.set(xscale="log", xlabel="token position in the input", ylabel="mean loss (nats per token)")
    pos_ax.set_title(f"Loss by position in {lengths[-1]}-token inputs")
    for ax in (ppl_ax, delta_ax, pos_ax):
        mark_train_len(ax, train_lens)
        ax.grid(alpha=0.3, which="both")
    key.set_axis_off()
    key.legend(*ppl_ax.get_legend_handles_labels(), loc="center", title="model")
    panel.suptitle("Perplexity beyond the training length")
    return save(fig, Path(path))


RETRIEVED = "share of prompts answered exactly"
#: What each retrieval task asks, in words, for figure titles (docs/evaluation.md has the details).
TASK_TITLES = {
    "passkey": "Passkey: find a number hidden in repeated filler sentences",
    "single_repeat": "Needle in a haystack: one number hidden in repeated sentences",
    "single_corpus": "Needle in a haystack: one number hidden in real text",
    "single_uuid": "Needle in a haystack: one UUID hidden in real text",
    "multikey": "Needle in a haystack: one key's number, among four keys",
    "multivalue": "Needle in a haystack: all four numbers of one key",
    "multiquery": "Needle in a haystack: the numbers of four keys",
}


def plot_retrieval_heatmaps(
    results: dict[str, dict], path: Path, title: str = "", *, run: RunScale | None = None
) -> Path:
    """Accuracy heatmaps over length (x) and depth (y), one per model, with the mean over depths
    in the bottom row and over lengths in the last column (seed 003 Fig. 3)."""
    n = len(results)
    cols = min(n, 4)
    rows = -(-n // cols)
    caption = (
        "One panel per model. Each cell is the share of prompts in which the model reproduced the "
        "hidden answer exactly, at one input length (column) and one depth of the hidden text (row: "
        "0 = at the start of the input, 1 = at its end, just before the question). Beyond the black "
        "lines, the bottom row averages over depths and the right column over lengths; the panel "
        "title gives the overall mean. Green: found; red: not found."
    )
    fig, panel = captioned_figure((4.2 * cols + 1.2, 4.2 * rows + 0.4), caption, run=run)
    axes = np.atleast_2d(panel.subplots(rows, cols, sharey=True, squeeze=False)).ravel()
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
        ax.set_title(f"{label} (mean {acc.mean():.2f})")
        ax.set_xlabel("input length (tokens)")
        ax.set_ylabel("depth of the hidden text")
    for ax in axes[n:]:
        ax.set_visible(False)
    panel.colorbar(image, ax=axes[:n], shrink=0.8, label=RETRIEVED)
    panel.suptitle(title or "Retrieval by input length and depth")
    return save(fig, Path(path))


def plot_accuracy_vs_length(
    results: dict[str, dict],
    path: Path,
    title: str = "accuracy",
    *,
    run: RunScale | None = None,
    styles: dict[str, dict] | None = None,
) -> Path:
    """Mean accuracy over depths against length, one line per model (log-x)."""
    with legible():
        return _plot_accuracy_vs_length(results, path, title, run, styles or {})


def _plot_accuracy_vs_length(
    results: dict[str, dict], path: Path, title: str, run: RunScale | None, styles: dict[str, dict]
) -> Path:
    train_lens = {r["train_len"] for r in results.values() if "train_len" in r}
    caption = (
        "Each line is one model: the share of prompts in which it reproduced the hidden answer "
        "exactly, averaged over the depths of the hidden text, against the input length. "
        + (
            "The dotted line is the training length; right of it the inputs are longer than any "
            "seen in training. "
            if train_lens
            else ""
        )
        + "Lines with the same values lie on top of each other, so the last drawn can hide the "
        "others (all at 0: no model found the answer)."
    )
    fig, panel = captioned_figure((PAGE_WIDTH * 0.75, 4.8), caption, fontsize=11, run=run)
    ax = panel.subplots()
    for i, (label, r) in enumerate(results.items()):
        style = dict(color=f"C{i}", marker="o") | styles.get(label, {})
        ax.plot(r["lengths"], r["by_length"], label=label, **style)
    length_axis(ax, sorted({n for r in results.values() for n in r["lengths"]}))
    mark_train_len(ax, train_lens)
    ax.set(ylim=(-0.03, 1.03), xlabel="input length (tokens)", ylabel=RETRIEVED)
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="center left", bbox_to_anchor=(1.02, 0.5))
    return save(fig, Path(path))
