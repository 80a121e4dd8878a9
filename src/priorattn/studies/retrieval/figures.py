"""Figures of the retrieval study: exact match against length with intervals, length x depth
heatmaps, and the log-priors the models learned. Each mechanism in its style
(:func:`priorattn.studies.styles.mechanism_style`: a colour and marker per position, dashed with
SSMax), the same in every figure of every study."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...eval.plots import length_axis, mark_train_len, plot_retrieval_heatmaps
from ...figures import PAGE_WIDTH, captioned_figure, legible, save
from ..styles import mechanism_style
from .study import RetrievalStudyConfig

TASK_TITLES = {
    "passkey": "Passkey: the value after the needle marker",
    "niah": "Multi-key NIAH: one key's value among distractors",
    "mqar": "MQAR: every key's value",
    "text_passkey": "Passkey in text: the value after the marker, in Shakespeare",
    "latest": "Latest: the last value a key was given",
    "first": "First: the first value a key was given",
    "offset": "Offset: the value 3 tokens after the marker",
    "span": "Span: a span with repeats, copied in order",
}


def draw_study_figures(config: RetrievalStudyConfig, data: dict, out: Path) -> dict[str, Path]:
    figures = dict(accuracy=plot_accuracy(config, data["summary"], out / "retrieval_accuracy.png"))
    for task in config.tasks:
        results = {
            s["label"]: dict(
                accuracy=s["tasks"][task]["heatmap"],
                lengths=config.lengths(),
                depths=s["tasks"][task]["depths"],
            )
            for s in data["summary"].values()
        }
        figures[f"heatmap_{task}"] = plot_retrieval_heatmaps(
            results, out / f"retrieval_heatmap_{task}.png", title=TASK_TITLES[task], run=config.scale
        )
    curves = {m: runs[0]["prior_curve"] for m, runs in data["runs"].items() if runs[0]["prior_curve"]}
    if curves:
        figures["priors"] = plot_learned_priors(config, curves, data["summary"], out / "retrieval_priors.png")
    return figures


def plot_accuracy(config: RetrievalStudyConfig, summary: dict, path: Path) -> Path:
    """Exact match against length, one panel per task, with the Wilson 95% band of each mechanism;
    one legend below the panels."""
    with legible():
        return _plot_accuracy(config, summary, path)


def _plot_accuracy(config: RetrievalStudyConfig, summary: dict, path: Path) -> Path:
    caption = (
        "Each line is one mechanism: the share of sequences whose whole answer the model predicts exactly, "
        f"pooled over {len(config.seeds)} seeds, {config.depths} "
        f"needle depths and {config.prompts} sequences "
        "per cell (the seeds that retrieve at T), against the input length (log scale). The "
        "band is the Wilson 95% interval. The dotted line "
        "is the training length T: right of it every input is longer than any seen in training. Colour and "
        "marker: the positional mechanism; dashed: with SSMax."
    )
    n = len(config.tasks)
    rows = -(-len(summary) // 5)  # legend rows of five mechanisms
    fig, panel = captioned_figure((PAGE_WIDTH, 4.6 + 0.3 * rows), caption, fontsize=11, run=config.scale)
    axes = np.atleast_1d(panel.subplots(1, n, sharey=True))
    lengths = config.lengths()
    for ax, task in zip(axes, config.tasks):
        for mechanism, s in summary.items():
            t = s["tasks"][task]
            style = mechanism_style(mechanism)
            ax.plot(t["lengths"], t["accuracy"], label=s["label"], **style)
            ax.fill_between(t["lengths"], t["low"], t["high"], color=style["color"], alpha=0.12)
        length_axis(ax, lengths)
        mark_train_len(ax, {config.train_len})
        ax.set(ylim=(-0.03, 1.03), xlabel="input length (tokens)")
        ax.set_title(TASK_TITLES[task], fontsize=11)
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("exact match (share of sequences)")
    panel.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncol=5)
    panel.suptitle("Retrieval beyond the training length")
    return save(fig, path)


#: The line style of each group of identical layers in :func:`plot_learned_priors`.
LAYER_STYLES = ("-", "--", ":", "-.") * 8


def layer_groups(layers: list) -> list[tuple[str, list]]:
    """The layers' log-prior curves (``[layer][head][point]``, None for a layer without a prior)
    grouped where they are equal (a fixed prior such as ALiBi gives every layer the same), so that
    one group is drawn once: ``[("layers 0, 1", heads), ...]``."""
    groups: list[tuple[list[int], list]] = []
    for layer, heads in enumerate(layers):
        if heads is None:
            continue
        same = next((g for g in groups if np.allclose(g[1], heads, rtol=0, atol=1e-9)), None)
        if same is None:
            groups.append(([layer], heads))
        else:
            same[0].append(layer)
    return [
        (("layer " if len(ids) == 1 else "layers ") + ", ".join(map(str, ids)), heads)
        for ids, heads in groups
    ]


def plot_learned_priors(config: RetrievalStudyConfig, curves: dict, summary: dict, path: Path) -> Path:
    """Seed 0's log-prior for the last query of the longest input against the key's distance, one
    panel per mechanism with a prior, one line per (layer, head), equal layers drawn once."""
    longest = config.lengths()[-1]
    caption = (
        f"What each learned prior tells attention (seed {config.seeds[0]}): the log-prior added to the "
        f"score of a key d tokens before the last query of a {longest}-token input, against d (log scale), "
        "one line per layer and head (a colour per head, a line style per layer; layers whose priors are "
        "equal, as a fixed prior's are, drawn once), each shifted so that its largest value is 0. A needle "
        "whose log-prior lies far below the nearby keys' needs a content score that much larger to be "
        "found. The dotted "
        "line is the training length."
    )
    n = len(curves)
    cols = min(n, 4)
    rows = -(-n // cols)
    fig, panel = captioned_figure((4.4 * cols, 3.6 * rows), caption, fontsize=11, run=config.scale)
    axes = np.atleast_1d(panel.subplots(rows, cols, squeeze=False)).ravel()
    for ax, (mechanism, curve) in zip(axes, curves.items()):
        distance = np.asarray(curve["distance"]) + 1  # log axis: d + 1
        for style, (layers, heads) in zip(LAYER_STYLES, layer_groups(curve["layers"])):
            for head, values in enumerate(heads):
                values = np.asarray(values)
                ax.plot(distance, values - values.max(), color=f"C{head}", linestyle=style,
                        label=f"{layers}, head {head}")  # fmt: skip
        ax.axvline(config.train_len, color="0.5", linestyle=":", linewidth=1)
        ax.set(xscale="log", xlabel="key distance d + 1 (tokens)", ylabel="log-prior (max = 0)")
        ax.set_title(summary[mechanism]["label"], fontsize=12, color=mechanism_style(mechanism)["color"])
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)  # each panel's own: its groups of equal layers are its own
    for ax in axes[n:]:
        ax.set_visible(False)
    panel.suptitle("The log-priors the models learned", fontsize=13)
    return save(fig, path)
