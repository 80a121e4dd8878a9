"""The figures of ``priorattn dna`` (seed 000 Fig. 4): validation NLL and bits per base, training
throughput and peak memory, and sampled continuations against the true genome."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...figures import RunScale, captioned_figure, save
from ..styles import mechanism_style
from .config import DNAConfig
from .measures import gc_trajectory

MATCH, MISMATCH = "#2e9e44", "#e07b00"  # seed 000 Fig. 4c: green = match, orange = mismatch
BASES_PER_LINE = 50


def plot_nll(results: dict, path: Path, *, run: RunScale) -> Path:
    """How far each model's validation loss is below the unigram baseline, in bits per base, with
    its NLL in nats written on the bar (seed 000 Fig. 4a)."""
    caption = (
        "Next-base loss on regions of the genome held out of training, for models that differ only "
        "in how position enters attention. A bar is how many bits per base the model saves against "
        "the unigram baseline (the base frequencies alone; higher is better); written on it are "
        "the model's validation negative log-likelihood in nats per base and in bits per base "
        "(nats / ln 2). The baseline itself is in the title; 2 bits is a uniform guess among "
        "A, C, G, T."
    )
    fig, panel = captioned_figure((6.5, 4.0), caption, run=run)
    ax = panel.subplots()
    models, baseline = results["models"], results["unigram_bits_per_base"]
    gains = [baseline - m["bits_per_base"] for m in models.values()]
    colours = [mechanism_style(name)["color"] for name in models]
    bars = ax.bar([m["label"] for m in models.values()], gains, color=colours)
    notes = [f"{m['val_nll']:.4f} nats\n{m['bits_per_base']:.4f} bits" for m in models.values()]
    ax.bar_label(bars, notes, fontsize=8, padding=2)
    ax.axhline(0, color="0.3", linewidth=1)
    ax.set_ylabel("bits per base saved against the unigram baseline")
    ax.margins(y=0.25)
    ax.set_title(f"Validation loss on held-out genome regions\n(unigram baseline {baseline:.4f} bits/base)")
    return save(fig, path)


def plot_efficiency(results: dict, path: Path, *, run: RunScale) -> Path:
    """Training tokens/s and peak resident memory of each model (seed 000 Fig. 4b)."""
    caption = (
        "Training cost of each model under the same budget. Solid: training throughput in bases "
        "per second (the median over logged intervals, CPU). Hatched: the peak resident memory of "
        "the training process; the dashed line is the memory of a process that only imports the "
        "library and torch, so the part above it is what training adds. Seed 000 measured peak "
        "CUDA memory of a 125M model; on a CPU with a tiny model the interpreter is a large share."
    )
    fig, panel = captioned_figure((6.5, 4.0), caption, run=run)
    models = results["models"]
    x = np.arange(len(models))
    ax = panel.subplots()
    twin = ax.twinx()
    ax.bar(x - 0.2, [m["tokens_per_s"] for m in models.values()], 0.4, color="C0", label="bases/s (training)")
    memory = [m["peak_rss_mb"] for m in models.values()]
    twin.bar(x + 0.2, memory, 0.4, color="C1", hatch="//", alpha=0.7, label="peak memory (MB)")
    twin.axhline(results["import_rss_mb"], color="0.3", linestyle="--", linewidth=1, label="import only (MB)")
    twin.set_ylim(0, 1.1 * max(memory))
    ax.set_xticks(x, [m["label"] for m in models.values()])
    ax.set_ylabel("bases/s (training)")
    twin.set_ylabel("peak memory (MB)")
    handles = [h for a in (ax, twin) for h in a.get_legend_handles_labels()[0]]
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=3, fontsize=8, frameon=False)
    return save(fig, path)


def plot_continuations(results: dict, config: DNAConfig, path: Path) -> Path:
    """Each model's first sampled continuation coloured by match to the truth, and the GC% of every
    continuation's sliding window against the truth's (seed 000 Fig. 4c)."""
    models = results["models"]
    first = next(iter(models.values()))["continuations"][0]
    lines = -(-len(first["truth"]) // BASES_PER_LINE)
    caption = (
        f"Top: after the same {config.prompt_bases}-base prompt from a held-out region, each model "
        f"samples {config.new_bases} bases (temperature {config.temperature:g}, every model with the "
        "same random numbers, so differences come from the models); a base is green "
        "where it equals the genome's next base and orange where it does not (a quarter of them "
        "match by chance). Bottom: GC content of each window of "
        f"{config.gc_window} bases sliding along the continuation, the true sequence as a wide grey band. "
        "The legend gives each model's Pearson r with the truth and its match rate, both averaged "
        f"over {config.continuations} continuations."
    )
    height = 1.2 + 0.22 * lines * (len(models) + 1) + 2.6
    fig, panel = captioned_figure((9.0, height), caption, run=config.scale)
    top, bottom = panel.subfigures(2, 1, height_ratios=[0.22 * lines * (len(models) + 1) + 0.6, 2.6])
    ax = top.subplots()
    ax.set_axis_off()
    ax.set_xlim(0, BASES_PER_LINE)
    rows = [("truth", first["truth"], None)]
    rows += [(m["label"], m["continuations"][0]["generated"], first["truth"]) for m in models.values()]
    y = 0
    for label, sequence, truth in rows:
        ax.text(-1, -y, label, ha="right", va="top", fontsize=8, fontweight="bold")
        for i, base in enumerate(sequence):
            colour = "black" if truth is None else MATCH if base == truth[i] else MISMATCH
            row, col = divmod(i, BASES_PER_LINE)
            shown = base if base in "ACGTN" else "?"  # a sampled byte that is no base
            ax.text(col, -(y + row), shown, color=colour, fontsize=7, family="monospace", va="top")
        y += lines + 0.5
    ax.set_ylim(-y, 0.5)
    ax.set_title(f"Sampled continuations, first prompt (prompt ends ...{first['prompt'][-30:]})", fontsize=9)
    gc = bottom.subplots()
    # the truth as a wide light band, apart from every mechanism's line (NoPE's is black)
    gc.plot(gc_trajectory(first["truth"], config.gc_window), color="0.75", linewidth=5, label="truth")
    for name, m in models.items():
        r = "undefined" if m["gc_pearson"] is None else f"{m['gc_pearson']:.2f}"
        label = f"{m['label']} (r = {r}, match {100 * m['match_rate']:.0f}%)"
        style = mechanism_style(name) | dict(marker=None)  # a point per window would hide the line
        gc.plot(gc_trajectory(m["continuations"][0]["generated"], config.gc_window), label=label, **style)
    gc.set_xlabel(f"window start (base after the prompt), window = {config.gc_window}")
    gc.set_ylabel("GC %")
    gc.set_ylim(0, 100)
    gc.legend(fontsize=8, loc="upper right")
    return save(fig, path)
