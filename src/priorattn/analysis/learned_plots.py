"""Pictures of trained runs (``priorattn analyze``): learned log-prior curves and GOAT's learned sink
beyond the training length, the prior before and after the causal mask, one head's attention on a
prompt, and attention mass on key 0 against the content's range. The drawing helpers and the
illustrative priors are :mod:`priorattn.analysis.plots`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..figures import captioned_figure, heatmap, save
from ..priors import GOAT, Prior
from .plots import (
    CURVE_FLOOR,
    PROB_FLOOR,
    causal_heatmap,
    causal_prior_probs,
    draw_curves,
    pick_head,
    prob_colours,
    visible_probs,
)


def full_prior_probs(K: Tensor) -> Tensor:
    """Row softmax of ``K: (..., Lq, Lk)`` over every key, before any mask (seed 000 Fig. 3b, left)."""
    return torch.softmax(K, dim=-1)


@torch.no_grad()
def sink_values(prior: GOAT, positions: Tensor) -> np.ndarray:
    """GOAT's key-only sink ``u_h(j)`` (seed 000 Eq. 19) at ``positions``: ``(H, N)``."""
    return prior.sink(positions).double().numpy()


def sink_positions(length: int, count: int = 1024, first: int = 64) -> np.ndarray:
    """Where the sink curve is drawn over ``[0, length)``: every one of the ``first`` keys (the spike
    at 0 is one key wide) and ``count`` evenly spaced ones beyond."""
    spaced = np.linspace(0, length - 1, count).round().astype(int)
    return np.unique(np.concatenate([np.arange(min(first, length)), spaced]))


def plot_learned_curves(
    out: Path, layers: list[tuple[str, list[tuple[str, Prior, int]]]], length: int
) -> Path:
    """``prior_curves.png``: one row per ``(layer title, [(head label, prior, head), ...])``, one line
    per head, seen from the last query of a ``length``-token sequence (seed 003 Figs. 1 and 4)."""
    query = length - 1
    caption = (
        f"One row per attention layer, one line per head, seen from the query at position {query} "
        f"looking back over every key of a {length}-token sequence (the training length); keys after the "
        "query are masked by causal attention and not drawn. Left: the log-prior the run's prior "
        "(learned; ALiBi's is fixed) adds "
        f"to each key's attention score, shifted so the best key is at 0 and cut off at {CURVE_FLOOR:g}. "
        "Right: the attention weights the prior alone gives (its softmax over the visible keys), i.e. "
        "where the head looks when no key's content stands out.\n\n"
        "Look for: heads whose line falls steeply (short memory, ALiBi-like: a BAM shape near 1), heads "
        "with heavy tails (BAM shape between 0 and 1) and heads whose weight rises with distance (a BAM "
        "shape at or below 0: the prior avoids nearby keys, seed 003 Theorems 3-4). The legend gives each "
        "head's learned parameters: for BAM the shape beta, the width in tokens and the centre."
    )
    fig, panel = captioned_figure((15, 5 * len(layers)), caption)
    axes = panel.subplots(len(layers), 2, squeeze=False)
    for (title, curves), (ax_log, ax_prob) in zip(layers, axes):
        draw_curves(ax_log, ax_prob, curves, length, query)
        ax_log.set_title(f"{title}: bonus or penalty each key gets from the prior", fontsize=10)
        ax_prob.set_title(f"{title}: attention the prior alone would give", fontsize=10)
        ax_log.legend(fontsize=8)
    panel.suptitle("The priors of a trained run: how each head weighs the keys behind the last query")
    return save(fig, out / "prior_curves.png")


def plot_learned_sink(
    out: Path, layers: list[tuple[str, np.ndarray, list[str]]], positions: np.ndarray, train_len: int
) -> Path:
    """``sink.png``: each ``(layer title, u: (H, N), head labels)``'s sink ``u_h(j)`` at key
    ``positions``, far past the training length ``train_len`` (seed 000 Fig. 2b)."""
    zoom = min(train_len, 32)
    caption = (
        "GOAT's sink u(j) is a bonus the prior adds to the attention score of key j, whatever the query "
        "(seed 000 Eq. 19). One row per attention layer, one line per head. Left: u(j) from key 0 to "
        f"{positions[-1] + 1} keys, {(positions[-1] + 1) / train_len:g} times the training length "
        f"{train_len} (the dotted line): the sink is a function of the key position, so it is defined "
        f"past the training length, but it was only trained up to it. Right: the first {zoom} keys.\n\n"
        "Look for: a spike at key 0 (an attention sink: when no key's content stands out, queries put "
        "their weight on the first token) and how u behaves past the dotted line, where the model never "
        "saw a key during training. Only differences of u between keys matter: adding a constant to u "
        "does not change attention."
    )
    fig, panel = captioned_figure((14, 4.2 * len(layers)), caption)
    axes = panel.subplots(len(layers), 2, squeeze=False, width_ratios=[3, 1])
    first = positions < zoom
    for (title, u, labels), (ax_all, ax_first) in zip(layers, axes):
        for values, label in zip(u, labels):
            (line,) = ax_all.plot(positions, values, lw=1.2, label=label)
            ax_first.plot(positions[first], values[first], marker=".", color=line.get_color())
        ax_all.axvline(train_len, color="0.3", ls=":", label=f"training length ({train_len} tokens)")
        ax_all.set_title(f"{title}: sink bonus u(j) of every key", fontsize=10)
        ax_first.set_title(f"{title}: the first {zoom} keys", fontsize=10)
        for ax in (ax_all, ax_first):
            ax.set_xlabel("key position j")
            ax.set_ylabel("sink bonus u(j) added to the score of key j")
            ax.grid(alpha=0.3)
        ax_all.legend(fontsize=8)
    panel.suptitle("Learned sink of GOAT: the bonus of each key position, past the training length")
    return save(fig, out / "sink.png")


def plot_mask_renormalization(out: Path, rows: list[tuple[str, Prior, int]], length: int) -> Path:
    """``prior_heatmaps.png``: each ``(title, prior, head)``'s prior probability over every key, then
    after the causal mask and row renormalization (seed 000 Fig. 3b)."""
    caption = (
        "One row of panels per attention head. Each panel has one row per query position i and one "
        "column per key position j. Left: the prior alone as a distribution over every key, the softmax "
        "of each row of the log-prior before any mask, keys after the query included. Right: the same "
        "prior after the causal mask, which removes the keys after the query (the blank upper triangle), "
        "and renormalization of each row over the keys left: the attention the prior alone gives. Both "
        "on one log colour scale; black is below 1e-8.\n\n"
        "Look for: where the unmasked prior puts its mass (later keys, a band around the query, or key "
        "0), and how the mask turns it into a recency band along the diagonal or a bright sink column "
        "at key 0."
    )
    fig, panel = captioned_figure((10.5, 4.6 * len(rows)), caption, fontsize=9)
    axes = panel.subplots(len(rows), 2, squeeze=False)
    for (title, prior, head), (ax_full, ax_causal) in zip(rows, axes):
        pos = torch.arange(length)
        with torch.no_grad():
            K = pick_head(prior.log_prior(pos, pos), head).double()  # (L, L)
        full = np.maximum(full_prior_probs(K).numpy(), PROB_FLOOR)
        heatmap(panel, ax_full, full, f"{title}\nprior over every key (no causal mask)", **prob_colours())
        image = causal_heatmap(
            panel, ax_causal, causal_prior_probs(K).numpy(), f"{title}\nafter the causal mask", colorbar=False
        )
    panel.colorbar(image, ax=axes, shrink=0.5, label="prior probability (log scale; black: below 1e-8)")
    panel.suptitle(f"The priors of a trained run before and after the causal mask (L = {length})")
    return save(fig, out / "prior_heatmaps.png")


def token_labels(pieces: list[str]) -> list[str]:
    """Tokens as tick labels: whitespace made visible, long pieces cut."""
    shown = [p.replace("\n", "\\n").replace("\t", "\\t").replace(" ", "␣") for p in pieces]
    return [p if len(p) <= 8 else p[:7] + "…" for p in shown]


#: Prompts longer than this get position ticks instead of one tick per token.
MAX_TOKEN_TICKS = 64


def plot_attention_map(out: Path, weights: np.ndarray, pieces: list[str], title: str, note: str) -> Path:
    """``attention.png``: one head's attention ``weights: (L, L)`` on a prompt of tokens ``pieces``,
    and the last query's row (seed 003 Fig. 4). ``note`` (the head's prior, in words) ends the caption."""
    length = len(pieces)
    caption = (
        "Left: the attention weights of one head of the trained model on the prompt, one row per query "
        "token i and one column per key token j, on a log colour scale (black: below 1e-8); the blank "
        "upper triangle holds keys after the query, which causal attention never sees. Each row sums "
        "to 1. Right: the last row, where the final token of the prompt looks.\n\n"
        "Look for: a bright diagonal (the head attends to recent tokens), a bright first column (an "
        "attention sink), or bright cells far below the diagonal (the head retrieves distant tokens, as "
        "the BAM heads with a shape at or below 0 in seed 003 Fig. 4). " + note
    )
    fig, panel = captioned_figure((15, 6.5), caption)
    ax_map, ax_last = panel.subplots(1, 2, width_ratios=[1, 1.3])
    label = "attention weight (log scale; black: below 1e-8)"
    heatmap(
        panel, ax_map, visible_probs(weights), "attention weights of every query", label, **prob_colours()
    )
    keys = np.arange(length)
    ax_last.bar(keys, np.maximum(weights[-1], PROB_FLOOR), color="C0", width=1.0)
    ax_last.set_yscale("log")
    ax_last.set_ylim(PROB_FLOOR, 1.0)
    ax_last.set_title(
        f"attention of the last token ({token_labels(pieces[-1:])[0]!r}) to each key", fontsize=10
    )
    ax_last.set_xlabel("key token j")
    ax_last.set_ylabel("attention weight (log scale)")
    ax_last.grid(alpha=0.3, axis="y")
    if length <= MAX_TOKEN_TICKS:
        ticks = token_labels(pieces)
        ax_map.set_xticks(keys, ticks, rotation=90, fontsize=7)
        ax_map.set_yticks(keys, ticks, fontsize=7)
        ax_last.set_xticks(keys, ticks, rotation=90, fontsize=7)
    panel.suptitle(title)
    return save(fig, out / "attention.png")


def plot_sink_mass(
    out: Path,
    omegas: np.ndarray,
    curves: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]],
    uniform_shares: dict[int, float],
) -> Path:
    """``sink_mass.png``: each ``(label, mean, lowest, highest)``'s attention mass on key 0 against the
    content's dynamic range ``omegas`` (seed 000 Fig. 2c, Thm. 5.1), with the share of key 0 under a
    uniform prior at each query length of ``uniform_shares``."""
    caption = (
        "Each line is one trained run's prior: the attention mass that queries put on the first key "
        "(key 0, where a sink forms) when random content scores with dynamic range omega (the largest "
        "minus the smallest score of a query's visible keys) are added to the run's log-prior; the "
        "shaded band spans its layers and heads (the line is their mean). At omega = 0 the content is "
        "flat and attention is the prior alone; seed 000 Theorem 5.1 bounds every weight within a "
        "factor exp(omega) of the prior's.\n\n"
        "Look for: a prior with a sink starts near 1 and sheds the mass as omega grows (the content "
        "takes over); a prior without one starts at the uniform share of key 0 or below (recency priors "
        "such as ALiBi give it almost nothing). As omega grows without bound the content decides alone "
        "and every curve tends to the dashed line, the share of key 0 when the content's largest score "
        "is equally likely at any visible key. The content scores are random, not the model's: this "
        "measures what each prior does by default, not what the trained model attends to."
    )
    fig, panel = captioned_figure((10, 5.5), caption)
    ax = panel.subplots()
    for label, mean, lowest, highest in curves:
        (line,) = ax.plot(omegas, mean, marker="o", label=label)
        ax.fill_between(omegas, lowest, highest, color=line.get_color(), alpha=0.15)
    for length, share in sorted(uniform_shares.items()):
        label = f"uniform share of key 0 over {length} positions (no prior; where every prior ends)"
        ax.axhline(share, color="0.4", ls="--", lw=1, label=label)
    ax.set_xscale("symlog", linthresh=min((o for o in omegas if o > 0), default=1.0))
    ax.set_xlabel("content dynamic range omega (largest minus smallest score of a query; log scale past 0)")
    ax.set_ylabel("mean attention mass on key 0")
    top = max([*(highest.max() for *_, highest in curves), *uniform_shares.values()])
    ax.set_ylim(0.0, min(1.02, 1.15 * top))  # small masses stay readable; a full sink reaches 1
    ax.set_xlim(0.0, max(omegas.max(), 1.0) * 1.1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9)
    ax.set_title("Attention mass on the sink key as the content signal grows", fontsize=10)
    panel.suptitle("Signal strength against sink mass (seed 000 Theorem 5.1)")
    return save(fig, out / "sink_mass.png")
