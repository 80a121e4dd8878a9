"""Pictures of priors: log-prior curves over relative position, GOAT's decomposition, heatmaps.

Each ``plot_*`` function draws one PNG and returns its path. The arrays they draw come from small
functions (``prior_curve``, ``prior_matrices``, ``goat_components``) that tests check against the
seeds' formulas. Figures are built on :class:`matplotlib.figure.Figure` directly (no pyplot), so
nothing here touches a display or a global backend.

Every figure is meant to be read without the papers: a plain-language title, axis labels in words,
legends in words (parameters by name, not as theta symbols) and a caption under the axes saying what
is plotted, how to read it and what to look for. Keys a causal query never sees (``j > i``) are left
blank, not coloured.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from matplotlib.colors import LogNorm, TwoSlopeNorm
from matplotlib.figure import Figure
from torch import Tensor
from torch.nn import functional as F

from ..figures import RunScale, captioned_figure, heatmap, save
from ..priors import GGD, GOAT, ALiBi, PerHeadSink, Prior, Sum, Uniform, alibi_slopes
from ..priors.goat import SharedSink

#: GGD's parameters, each ``theta_<name>`` (seed 003 App. C).
PARAMETERS = ("alpha", "beta", "mu")
#: Log-priors more than this far below a row's maximum are drawn at the floor of the curve panel.
CURVE_FLOOR = -20.0
#: Smallest probability the log colour scale of the heatmaps resolves.
PROB_FLOOR = 1e-8


def check_sizes(length: int, num_heads: int, head: int) -> None:
    """Raise a ``ValueError`` naming the first size that cannot be drawn."""
    if length < 2:
        raise ValueError(f"length must be >= 2 to have a relative position, got {length}")
    if num_heads < 1:
        raise ValueError(f"num_heads must be >= 1, got {num_heads}")
    if not 0 <= head < num_heads:
        raise ValueError(f"head must be in [0, {num_heads}), got {head}")


# ---------------------------------------------------------------------------------------------
# Priors with illustrative parameters


def ggd_scale(length: int) -> float:
    """The GGD scale ``alpha`` the figures use: a sixteenth of the sequence, 32 tokens at 512."""
    return length / 16


@torch.no_grad()
def ggd(num_heads: int, beta: float, scale: float, mu: float = 0.0) -> GGD:
    """A GGD prior with shape ``beta``, scale ``scale`` (tokens) and location ``mu`` in every head.

    Seed 003 App. C: ``beta = theta_beta``, ``alpha = exp(-theta_alpha / theta_beta)`` and
    ``mu = 2 sinh(theta_mu)``, so ``theta_alpha = -beta log(alpha)``, ``theta_mu = asinh(mu / 2)``
    and the log-prior is ``-(|j - i - mu| / alpha) ** beta`` (up to eps).
    """
    prior = GGD(num_heads)
    prior.theta_beta.fill_(beta)
    prior.theta_alpha.fill_(-beta * math.log(scale))
    prior.theta_mu.fill_(math.asinh(mu / 2))
    return prior


@torch.no_grad()
def spike_sink(sink: PerHeadSink | SharedSink, height: Tensor) -> None:
    """Set ``u_h(0) = height[h]`` and ``u_h(j) ~ 0`` for ``j >= 1``: a pure attention sink.

    The shared sink (one MLP times a per-head gain, plus a per-head bump at ``j = 0``) gets its
    bump as the spike and a zero MLP. The per-head sink has no bump: one hidden unit of its MLP
    reads the feature ``log(1 + j) / log(1 + train_len)``; its pre-activation is 4 at ``j = 0`` and
    at most -12 from ``j = 1`` on, where SiLU is below 1e-4. Every other weight, and the linear
    decay, is zero.
    """
    for p in sink.mlp.parameters():
        p.zero_()
    if isinstance(sink, SharedSink):
        sink.bump.copy_(height)
        return
    first, _, last = sink.mlp
    sink.decay.zero_()
    first.bias[0] = 4.0
    first.weight[0, -1] = -16.0 * math.log1p(sink.train_len) / math.log(2.0)
    last.weight[:, 0] = height / F.silu(torch.tensor(4.0))


def illustrative_goat(num_heads: int, length: int, sink: bool = True) -> GOAT:
    """GOAT with ALiBi-like spectral weights and, with ``sink``, a spike at key 0.

    ``init="alibi", slope=False`` fits ``-m_h d`` over lags ``d < length`` with the spectral terms
    alone (seed 000 Eq. 12); the sink spike ``u_h(0) = m_h length / 4`` outweighs that recency for
    the first quarter of the queries, so both behaviours show.
    """
    prior = GOAT(num_heads, init="alibi", slope="none", sink="per_head" if sink else "none", train_len=length)
    if sink:
        spike_sink(prior.sink, alibi_slopes(num_heads).to(prior.alpha.dtype) * length / 4)
    return prior


# ---------------------------------------------------------------------------------------------
# The arrays the figures draw


def pick_head(K: Tensor, head: int) -> Tensor:
    """Head ``head`` of ``(H, ...)``; a prior shared by every head (``H == 1``) has only one."""
    return K[0] if K.shape[0] == 1 else K[head]


def causal_prior_probs(K: Tensor) -> Tensor:
    """Row softmax of ``K: (..., Lq, Lk)`` over the keys ``j <= i``; zero above the diagonal."""
    visible = torch.ones(K.shape[-2:], dtype=torch.bool, device=K.device).tril()
    return torch.softmax(K.masked_fill(~visible, -math.inf), dim=-1)


@torch.no_grad()
def prior_curve(
    prior: Prior, length: int, query: int, head: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One query row: ``(offsets j - i, log-prior K(i, j), prior probability)``, each ``(L,)``.

    The probability is the softmax of ``K(i, j)`` over the visible keys ``j <= i`` and zero for
    ``j > i`` (seed 003 Fig. 1).
    """
    if not 0 <= query < length:
        raise ValueError(f"query must be in [0, {length}), got {query}")
    pos = torch.arange(length)
    K = pick_head(prior.log_prior(pos[query : query + 1], pos), head)[0].double()  # (L,)
    probs = torch.zeros_like(K)
    probs[: query + 1] = torch.softmax(K[: query + 1], dim=-1)
    return (pos - query).numpy(), K.numpy(), probs.numpy()


@torch.no_grad()
def prior_matrices(prior: Prior, length: int, head: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(log-prior K(i, j), causal row-softmax prior probability)``, each ``(L, L)``."""
    pos = torch.arange(length)
    K = pick_head(prior.log_prior(pos, pos), head).double()  # (L, L)
    return K.numpy(), causal_prior_probs(K).numpy()


@torch.no_grad()
def goat_components(prior: GOAT, length: int, head: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GOAT's parts (seed 000 Fig. 1): ``(sink u(j): (L,), relative κ(i - j): (L, L), total K)``.

    The relative part is the total minus the sink, ``K(i, j) - u(j)``.
    """
    pos = torch.arange(length)
    K = pick_head(prior.log_prior(pos, pos), head).double()  # (L, L)
    u = prior.sink(pos)[head].double() if prior.sink is not None else torch.zeros(length)
    return u.numpy(), (K - u).numpy(), K.numpy()


def identified_goat_components(
    u: np.ndarray, relative: np.ndarray, K: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`goat_components` with the straight-line part of the sink moved into the relative part.

    ``kappa(i - j) + u(j)`` splits a log-prior in one way only up to a line: with
    ``u(j) = u*(j) + c + a j``, ``K(i, j) = [kappa(i - j) + c - a (i - j)] + u*(j) + a i``, and the
    row constant ``a i`` changes no softmax (the reason seed 000 Fig. 1c centres rows). Lines are
    all a sink and a relative part can trade: ``kappa(i - j) + u(j) = f(i)`` on every ``j <= i``
    forces ``f`` affine. A trained GOAT drifts along that line (its sink even has a linear
    ``decay`` term), so the sink is read here as ``u*``: ``u`` minus its least-squares line over
    the positions drawn. Returns ``(u*, kappa*(i - j), K - a i)``.
    """
    keys = np.arange(len(u), dtype=float)
    slope, intercept = np.polyfit(keys, u, deg=1)
    line = intercept + slope * keys
    lags = keys[:, None] - keys[None, :]  # (L, L): i - j
    return u - line, relative + intercept - slope * lags, K - slope * keys[:, None]


# ---------------------------------------------------------------------------------------------
# Drawing helpers


def blank_future(values: np.ndarray) -> np.ndarray:
    """``values: (Lq, Lk)`` as float with NaN where ``j > i``: keys a causal query never sees are
    drawn blank instead of coloured."""
    return np.where(np.tri(*values.shape, dtype=bool), values, np.nan)


def curve_priors(num_heads: int, length: int, head: int) -> list[tuple[str, Prior]]:
    """The priors of :func:`plot_prior_curves`, with legends in words."""
    scale, shift = ggd_scale(length), -length / 8
    slope = float(alibi_slopes(num_heads)[head])
    width = f"width {scale:g} tokens"
    return [
        ("no prior (uniform, as NoPE): every key alike", Uniform()),
        (f"ALiBi: linear recency penalty, slope {slope:g} per token", ALiBi(num_heads)),
        (f"BAM GGD, shape 2 (Gaussian), {width}", ggd(num_heads, 2.0, scale)),
        (
            f"BAM GGD, shape 2, {width}, centred {-shift:g} tokens back",
            ggd(num_heads, 2.0, scale, mu=shift),
        ),
        (f"BAM GGD, shape 1 (Laplace = ALiBi, slope {1 / scale:g}), {width}", ggd(num_heads, 1.0, scale)),
        (f"BAM GGD, shape 0.5 (heavy tail), {width}", ggd(num_heads, 0.5, scale)),
        (f"BAM GGD, shape -0.5 (inverted: avoids nearby keys), {width}", ggd(num_heads, -0.5, scale)),
        (
            "GOAT relative part (8 frequencies) fitted to ALiBi's penalty",
            illustrative_goat(num_heads, length, False),
        ),
    ]


def plot_prior_curves(out: Path, length: int = 512, num_heads: int = 8, head: int = 0) -> Path:
    """``prior_curves.png``: log-prior and prior probability against ``j - i`` (seed 003 Fig. 1)."""
    check_sizes(length, num_heads, head)
    query = length // 2
    caption = (
        f"Each line is one prior, seen from the query at position {query} looking back over the "
        f"{query} keys before it; keys after the query are masked by causal attention and not drawn. "
        "Left: the log-prior K(i, j), the number the prior adds to the attention score of key j, "
        f"shifted so the best key is at 0 and cut off at {CURVE_FLOOR:g}. Right: the attention "
        "weights the prior alone gives (the softmax of the left-hand curve over the visible keys), "
        "i.e. where the query looks when no key's content stands out.\n\n"
        "Look for: how fast each line falls with distance (a steep fall means a short memory); "
        f"the shifted Gaussian, which prefers keys {length // 8} tokens back; and the inverted GGD, "
        "which penalises nearby keys and spreads its weight over distant ones. The BAM GGD curves "
        "are -(|j - i - centre| / width)^shape (seed 003 Sec. 2.3 and App. C: shape = theta_beta, width = "
        "exp(-theta_alpha / theta_beta), centre = 2 sinh(theta_mu)). The GOAT curve (dashed) is its "
        "relative part alone, with weights fitted to ALiBi: it overlies the ALiBi line."
    )
    fig, panel = captioned_figure((15, 7), caption)
    ax_log, ax_prob = panel.subplots(1, 2)
    curves = [(name, prior, head) for name, prior in curve_priors(num_heads, length, head)]
    draw_curves(ax_log, ax_prob, curves, length, query)
    ax_log.set_title("Bonus or penalty each key gets from the prior")
    ax_prob.set_title("Attention the prior alone would give (all content scores equal)")
    panel.suptitle(f"How each positional prior weighs the keys behind one query (query at position {query})")
    panel.legend(loc="outside lower center", ncols=2, fontsize=9)
    return save(fig, out / "prior_curves.png")


def draw_curves(ax_log, ax_prob, curves: list[tuple[str, Prior, int]], length: int, query: int) -> None:
    """Head ``head`` of each ``(label, prior, head)``: its log-prior on ``ax_log`` (best key at 0)
    and its prior probability on ``ax_prob``, over the keys ``j <= query`` (the masked future is not
    drawn)."""
    for name, prior, head in curves:
        offsets, K, probs = prior_curve(prior, length, query, head)
        visible = slice(0, query + 1)
        style = dict(lw=1.6, ls="--" if name.startswith("GOAT") else "-")
        (line,) = ax_log.plot(offsets[visible], K[visible] - K[visible].max(), label=name, **style)
        ax_prob.plot(offsets[visible], probs[visible], color=line.get_color(), **style)
    for ax in (ax_log, ax_prob):
        ax.set_xlabel("key position relative to the query, j - i (tokens; 0 is the query itself)")
        ax.set_xlim(-query, 0)
        ax.grid(alpha=0.3)
    ax_log.set_ylim(CURVE_FLOOR, 1.0)
    ax_log.set_ylabel("log-prior added to the attention score, best key = 0")
    ax_prob.set_yscale("log")
    ax_prob.set_ylim(PROB_FLOOR, 1.0)
    ax_prob.set_ylabel("attention weight from the prior alone (log scale)")


def visible_probs(probs: np.ndarray) -> np.ndarray:
    """Probabilities floored at ``PROB_FLOOR`` for a log scale; NaN (blank) where ``j > i``."""
    return blank_future(np.maximum(probs, PROB_FLOOR))


def prob_colours() -> dict:
    """Colours of every probability heatmap: one log scale, so a colorbar can be shared."""
    return dict(cmap="magma", norm=LogNorm(PROB_FLOOR, 1.0))


PROB_LABEL = "attention weight from the prior alone (log scale; black: below 1e-8)"


def causal_heatmap(fig: Figure, ax, probs: np.ndarray, title: str, colorbar: bool = True):
    """Prior probabilities on a log colour scale; the masked cells (j > i) are left blank."""
    return heatmap(fig, ax, visible_probs(probs), title, PROB_LABEL if colorbar else None, **prob_colours())


def zoom_on_sink(ax, probs: np.ndarray) -> None:
    """An inset over the first keys, in the blank j > i corner: the sink column is 1 pixel wide."""
    length = probs.shape[0]
    keys, queries = max(2, length // 32), max(2, length // 2)
    inset = ax.inset_axes([0.52, 0.5, 0.44, 0.38])
    inset.imshow(visible_probs(probs), interpolation="nearest", aspect="auto", **prob_colours())
    inset.set(xlim=(-0.5, keys - 0.5), ylim=(queries - 0.5, -0.5))
    inset.set_title(f"zoom: the first {keys} keys", fontsize=8)
    inset.tick_params(labelsize=7)
    ax.indicate_inset_zoom(inset, edgecolor="0.4")


def log_prior_heatmap(fig: Figure, ax, K: np.ndarray, title: str) -> None:
    """Log-prior of the visible keys on a linear colour scale from its 1st percentile up (clips the
    inverted GGD's dip at j = i); the masked cells (j > i) are left blank."""
    visible = blank_future(K)
    low, high = np.nanpercentile(visible, 1), np.nanmax(visible)
    label = "log-prior (added to the attention score)"
    heatmap(fig, ax, visible, title, label, cmap="viridis", vmin=low, vmax=high)


def plot_goat_decomposition(out: Path, length: int = 512, num_heads: int = 8, head: int = 0) -> Path:
    """``goat_decomposition.png``: sink, relative part, total and causal prior (seed 000 Fig. 1) of
    the illustrative GOAT (:func:`illustrative_goat`)."""
    check_sizes(length, num_heads, head)
    prior = illustrative_goat(num_heads, length)
    u, relative, K = goat_components(prior, length, head)
    slope = float(alibi_slopes(num_heads)[head])
    caption = (
        "Heatmaps have one row per query position i and one column per key position j; the blank "
        "upper triangle holds keys after the query, which causal attention never sees. The "
        "parameters are set by hand to show the two behaviours GOAT can learn, not trained: (a) a "
        f"sink bonus of {u[0]:.3g} on key 0 and none elsewhere (seed 000 Eq. 19); (b) the relative "
        f"part's spectral weights fitted to ALiBi's recency penalty -{slope:g} |i - j| (seed 000 "
        "Eq. 12; GOAT(init='alibi', slope=False)). (c) is their sum; shifting a row does not "
        "change attention, so each row is drawn with mean 0.\n\n"
        "Look for in (d): the bright column at key 0 (enlarged in the inset) is the sink. The first "
        "quarter of the queries put nearly all their attention there, because the sink's bonus is "
        "larger than the recency penalty up to that distance; later queries attend to their most "
        "recent keys, the bright band along the diagonal. Black: weight below 1e-8."
    )
    title = f"What GOAT's prior is made of: a sink plus a relative part (head {head}, L = {length})"
    return draw_goat_decomposition(out / "goat_decomposition.png", (u, relative, K), title, caption)


def draw_goat_decomposition(
    path: Path,
    components: tuple[np.ndarray, np.ndarray, np.ndarray],
    title: str,
    caption: str,
    *,
    run: RunScale | None = None,
) -> Path:
    """Seed 000 Fig. 1's four panels of one GOAT head's ``(u(j), kappa(i - j), K)`` (as
    :func:`goat_components` gives them, illustrative or learned): (a) the sink, (b) the relative
    part, (c) their sum with rows centred, (d) the causal prior probabilities. ``run``: the training
    run of a study, its steps above the panels."""
    u, relative, K = components
    length = len(u)
    visible = blank_future(K)
    centred = visible - np.nanmean(visible, axis=-1, keepdims=True)
    probs = causal_prior_probs(torch.from_numpy(K)).numpy()
    fig, panel = captioned_figure((13, 11), caption, run=run)
    (ax_a, ax_b), (ax_c, ax_d) = panel.subplots(2, 2)
    ax_a.plot(np.arange(length), u, color="C3")
    ax_a.set_xlabel("key position j (the token attended to)")
    ax_a.set_ylabel("sink bonus u(j) added to the score of key j")
    ax_a.set_title("(a) Sink: a bonus per key position, the same for every query", fontsize=10)
    ax_a.grid(alpha=0.3)
    label = "log-prior (added to the attention score)"
    relative_title = "(b) Relative part: depends only on the distance i - j"
    heatmap(panel, ax_b, blank_future(relative), relative_title, label, cmap="viridis")
    limit = np.nanmax(np.abs(centred))
    centred_title = "(c) Total log-prior (a + b), each row shifted to mean 0"
    norm = TwoSlopeNorm(0.0, -limit, limit)
    heatmap(panel, ax_c, centred, centred_title, label + ", row mean 0", cmap="RdBu_r", norm=norm)
    causal_heatmap(panel, ax_d, probs, "(d) Attention the prior alone gives (each row sums to 1)")
    zoom_on_sink(ax_d, probs)
    panel.suptitle(title)
    return save(fig, path)


def heatmap_priors(num_heads: int, length: int, head: int) -> list[tuple[str, Prior]]:
    """The priors of :func:`plot_heatmaps`, with titles in words."""
    heavy, inverted = (ggd(num_heads, b, ggd_scale(length)) for b in (0.5, -0.5))
    slope = float(alibi_slopes(num_heads)[head])
    return [
        (f"ALiBi: linear recency penalty, slope {slope:g}", ALiBi(num_heads)),
        ("BAM GGD, shape 0.5: heavy tail", heavy),
        ("BAM GGD, shape -0.5: inverted, avoids nearby keys", inverted),
        ("GOAT: recency fitted to ALiBi + sink on key 0", illustrative_goat(num_heads, length)),
        ("ALiBi + GOAT: their log-priors added", Sum(ALiBi(num_heads), illustrative_goat(num_heads, length))),
    ]


def plot_heatmaps(out: Path, length: int = 512, num_heads: int = 8, head: int = 0) -> Path:
    """``heatmaps.png``: each prior's log-prior and causal prior probability (seed 000 Fig. 3b)."""
    check_sizes(length, num_heads, head)
    priors = heatmap_priors(num_heads, length, head)
    caption = (
        "One row of panels per prior. Each panel has one row per query position i and one column "
        "per key position j; the blank upper triangle holds keys after the query, which causal "
        "attention never sees. Left: the log-prior the prior adds to each attention score (its own "
        "colour scale per panel). Right: the attention weights it alone gives (softmax over each "
        "row's visible keys), on one shared log scale; black is below 1e-8.\n\n"
        "Look for: ALiBi's bright band along the diagonal (attention to recent keys only); the heavy "
        "tail, which keeps weight on distant keys; the inverted GGD's dark stripe along the diagonal "
        "(nearby keys avoided) with the weight spread over the rest; and GOAT's bright column at "
        "key 0 (enlarged in the inset): an attention sink, where the first queries put nearly all "
        "their weight before recency takes over."
    )
    fig, panel = captioned_figure((10.5, 4.6 * len(priors)), caption, fontsize=9)
    axes = panel.subplots(len(priors), 2)
    for (name, prior), (ax_log, ax_prob) in zip(priors, axes):
        K, probs = prior_matrices(prior, length, head)
        log_prior_heatmap(panel, ax_log, K, f"{name}\nlog-prior of each visible key")
        title = f"{name}\nattention from the prior alone"
        image = causal_heatmap(panel, ax_prob, probs, title, colorbar=False)
        if any(isinstance(m, PerHeadSink) for m in prior.modules()):
            zoom_on_sink(ax_prob, probs)
    panel.colorbar(image, ax=axes[:, 1], shrink=0.5, label=PROB_LABEL)
    panel.suptitle(f"Where each prior sends attention, for every query (head {head}, L = {length})")
    return save(fig, out / "heatmaps.png")


def plot_priors(out: Path, length: int = 512, num_heads: int = 8, head: int = 0) -> list[Path]:
    """Every figure above, written to ``out`` (created if missing)."""
    return [
        plot(Path(out), length, num_heads, head)
        for plot in (plot_prior_curves, plot_goat_decomposition, plot_heatmaps)
    ]
