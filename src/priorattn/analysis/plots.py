"""Pictures of priors: log-prior curves over relative position, GOAT's decomposition, heatmaps.

Each ``plot_*`` function draws one PNG and returns its path. The arrays they draw come from small
functions (``prior_curve``, ``prior_matrices``, ``goat_components``) that tests check against the
seeds' formulas. Figures are built on :class:`matplotlib.figure.Figure` directly (no pyplot), so
nothing here touches a display or a global backend.
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

from priorattn.priors import GGD, GOAT, ALiBi, GOATSink, Prior, Sum, Uniform, alibi_slopes

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


def ggd_label(prior: GGD, head: int) -> str:
    """The raw parameters of one head, as the legends quote them."""
    ta, tb, tm = (float(getattr(prior, f"theta_{n}").detach()[head]) for n in PARAMETERS)
    return f"GGD θβ={tb:g}, θα={ta:.2f}, θμ={tm:.2f}"


@torch.no_grad()
def spike_sink(sink: GOATSink, height: Tensor) -> None:
    """Set ``u_h(0) = height[h]`` and ``u_h(j) ~ 0`` for ``j >= 1``: a pure attention sink.

    One hidden unit of the sink's MLP reads the feature ``log(1 + j) / log(1 + train_len)``; its
    pre-activation is 4 at ``j = 0`` and at most -12 from ``j = 1`` on, where SiLU is below 1e-4.
    Every other weight, and the linear decay, is zero.
    """
    first, _, last = sink.mlp
    for p in sink.mlp.parameters():
        p.zero_()
    sink.decay.zero_()
    first.bias[0] = 4.0
    first.weight[0, -1] = -16.0 * math.log1p(sink.train_len) / math.log(2.0)
    last.weight[:, 0] = height / F.silu(torch.tensor(4.0))


def illustrative_goat(num_heads: int, length: int, sink: bool = True) -> GOAT:
    """GOAT with ALiBi-like spectral weights and, with ``sink``, a spike at key 0.

    ``init="recency", slope=False`` fits ``-m_h d`` over lags ``d < length`` with the spectral terms
    alone (seed 000 Eq. 12); the sink spike ``u_h(0) = m_h length / 4`` outweighs that recency for
    the first quarter of the queries, so both behaviours show.
    """
    prior = GOAT(num_heads, init="recency", slope=False, sink=sink, train_len=length)
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


# ---------------------------------------------------------------------------------------------
# Figures


def save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def shade_future(ax, start: float, stop: float, label: str | None = None) -> None:
    ax.axvspan(start, stop, color="0.85", zorder=0, label=label)


def curve_priors(num_heads: int, length: int, head: int) -> list[tuple[str, Prior]]:
    """The priors of :func:`plot_prior_curves`, with their legends."""
    scale, shift = ggd_scale(length), -length / 8
    gaussians = [ggd(num_heads, 2.0, scale), ggd(num_heads, 2.0, scale, mu=shift)]
    tails = [ggd(num_heads, b, scale) for b in (1.0, 0.5, -0.5)]
    laplace = f"Laplace = ALiBi m={1 / scale:g}"
    names = ["Gaussian", f"Gaussian, μ={shift:g}", laplace, "heavy tail", "inverted"]
    slope = float(alibi_slopes(num_heads)[head])
    return [
        ("Uniform (NoPE)", Uniform()),
        (f"ALiBi m={slope:g} (head {head} of {num_heads})", ALiBi(num_heads)),
        *[(f"{ggd_label(p, head)} ({n})", p) for p, n in zip(gaussians + tails, names)],
        (f"GOAT relative, recency fit (head {head})", illustrative_goat(num_heads, length, False)),
    ]


def plot_prior_curves(out: Path, length: int = 512, num_heads: int = 8, head: int = 0) -> Path:
    """``prior_curves.png``: log-prior and prior probability against ``j - i`` (seed 003 Fig. 1)."""
    check_sizes(length, num_heads, head)
    query = length // 2
    fig = Figure(figsize=(15, 7), layout="constrained")
    ax_log, ax_prob = fig.subplots(1, 2)
    for name, prior in curve_priors(num_heads, length, head):
        offsets, K, probs = prior_curve(prior, length, query, head)
        style = dict(lw=1.6, ls="--" if name.startswith("GOAT") else "-")
        (line,) = ax_log.plot(offsets, K - K[: query + 1].max(), label=name, **style)
        ax_prob.plot(offsets[: query + 1], probs[: query + 1], color=line.get_color(), **style)
    for ax in (ax_log, ax_prob):
        shade_future(ax, 0.5, offsets[-1], "j > i (causally masked)" if ax is ax_log else None)
        ax.set_xlabel("relative position j - i")
        ax.set_xlim(offsets[0], offsets[-1])
        ax.grid(alpha=0.3)
    ax_log.set_ylim(CURVE_FLOOR, 1.0)
    ax_log.set_ylabel("log-prior K(i, j) − max over j ≤ i")
    ax_log.set_title(f"Log-prior at query i = {query} (floor {CURVE_FLOOR:g}; row shifts don't matter)")
    ax_prob.set_yscale("log")
    ax_prob.set_ylim(PROB_FLOOR, 1.0)
    ax_prob.set_ylabel("prior probability softmax over j ≤ i")
    ax_prob.set_title(f"Induced causal prior probability at query i = {query}")
    fig.suptitle(f"Positional priors over relative position (L = {length})")
    title = f"GGD scale α = exp(-θα / θβ) = {ggd_scale(length):g} tokens, location μ = 2 sinh(θμ)"
    fig.legend(loc="outside lower center", ncols=3, fontsize=9, title=title)
    return save(fig, out / "prior_curves.png")


def heatmap(fig: Figure, ax, values: np.ndarray, title: str, colorbar: bool = True, **kwargs):
    """Draw ``values: (Lq, Lk)`` over (key, query) axes; returns the image for a shared colorbar."""
    image = ax.imshow(values, interpolation="nearest", aspect="equal", **kwargs)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("key position j")
    ax.set_ylabel("query position i")
    if colorbar:
        fig.colorbar(image, ax=ax, shrink=0.85)
    return image


def visible_probs(probs: np.ndarray) -> np.ndarray:
    """Probabilities floored at ``PROB_FLOOR`` for a log scale; NaN (blank) where ``j > i``."""
    return np.where(np.tri(*probs.shape, dtype=bool), np.maximum(probs, PROB_FLOOR), np.nan)


def prob_colours() -> dict:
    """Colours of every probability heatmap: one log scale, so a colorbar can be shared."""
    return dict(cmap="magma", norm=LogNorm(PROB_FLOOR, 1.0))


def causal_heatmap(fig: Figure, ax, probs: np.ndarray, title: str, colorbar: bool = True):
    """Prior probabilities on a log colour scale; the masked cells (j > i) are left blank."""
    return heatmap(fig, ax, visible_probs(probs), title, colorbar, **prob_colours())


def zoom_on_sink(ax, probs: np.ndarray) -> None:
    """An inset over the first keys, in the blank j > i corner: the sink column is 1 pixel wide."""
    length = probs.shape[0]
    keys, queries = max(2, length // 32), max(2, length // 2)
    inset = ax.inset_axes([0.52, 0.5, 0.44, 0.38])
    inset.imshow(visible_probs(probs), interpolation="nearest", aspect="auto", **prob_colours())
    inset.set(xlim=(-0.5, keys - 0.5), ylim=(queries - 0.5, -0.5))
    inset.set_title(f"zoom: keys j < {keys}, queries i < {queries}", fontsize=8)
    inset.tick_params(labelsize=7)
    ax.indicate_inset_zoom(inset, edgecolor="0.4")


def log_prior_heatmap(fig: Figure, ax, K: np.ndarray, title: str) -> None:
    """Log-prior on a linear colour scale from its 1st percentile up (clips GGD's β < 0 spike)."""
    heatmap(fig, ax, K, title, cmap="viridis", vmin=np.percentile(K, 1), vmax=K.max())


def plot_goat_decomposition(out: Path, length: int = 512, num_heads: int = 8, head: int = 0) -> Path:
    """``goat_decomposition.png``: sink, relative part, total and causal prior (seed 000 Fig. 1)."""
    check_sizes(length, num_heads, head)
    prior = illustrative_goat(num_heads, length)
    u, relative, K = goat_components(prior, length, head)
    _, probs = prior_matrices(prior, length, head)
    centred = K - K.mean(axis=-1, keepdims=True)
    fig = Figure(figsize=(13, 11), layout="constrained")
    (ax_a, ax_b), (ax_c, ax_d) = fig.subplots(2, 2)
    ax_a.plot(np.arange(length), u, color="C3")
    ax_a.set_xlabel("key position j")
    ax_a.set_ylabel("u(j)")
    ax_a.set_title(f"(a) key-only sink component K_sink(i, j) = u(j), u(0) = {u[0]:.3g}", fontsize=10)
    ax_a.grid(alpha=0.3)
    relative_title = "(b) relative component K_rel(i, j) = κ(i − j) (fitted on i ≥ j only)"
    heatmap(fig, ax_b, relative, relative_title, cmap="viridis")
    limit = np.abs(centred).max()
    centred_title = "(c) row-centred total log-prior K(i, j) − mean_j K(i, j)"
    norm = TwoSlopeNorm(0.0, -limit, limit)
    heatmap(fig, ax_c, centred, centred_title, cmap="RdBu_r", norm=norm)
    causal_heatmap(fig, ax_d, probs, "(d) causal prior probability softmax over j ≤ i (log scale)")
    zoom_on_sink(ax_d, probs)
    slope = float(alibi_slopes(num_heads)[head])
    fig.suptitle(
        f"GOAT log-prior decomposition, head {head} of {num_heads}: spectral weights fitted to "
        f"-{slope:g}|i - j| (init='recency', slope=False), sink spike u(0) = m L / 4"
    )
    return save(fig, out / "goat_decomposition.png")


def heatmap_priors(num_heads: int, length: int, head: int) -> list[tuple[str, Prior]]:
    """The priors of :func:`plot_heatmaps`, with their titles."""
    heavy, inverted = (ggd(num_heads, b, ggd_scale(length)) for b in (0.5, -0.5))
    return [
        (f"ALiBi m={float(alibi_slopes(num_heads)[head]):g}", ALiBi(num_heads)),
        (f"{ggd_label(heavy, head)} (heavy tail)", heavy),
        (f"{ggd_label(inverted, head)} (inverted)", inverted),
        ("GOAT recency fit + sink", illustrative_goat(num_heads, length)),
        ("Sum(ALiBi, GOAT)", Sum(ALiBi(num_heads), illustrative_goat(num_heads, length))),
    ]


def plot_heatmaps(out: Path, length: int = 512, num_heads: int = 8, head: int = 0) -> Path:
    """``heatmaps.png``: each prior's log-prior and causal prior probability (seed 000 Fig. 3b)."""
    check_sizes(length, num_heads, head)
    priors = heatmap_priors(num_heads, length, head)
    fig = Figure(figsize=(10.5, 4.6 * len(priors)), layout="constrained")
    axes = fig.subplots(len(priors), 2)
    for (name, prior), (ax_log, ax_prob) in zip(priors, axes):
        K, probs = prior_matrices(prior, length, head)
        log_prior_heatmap(fig, ax_log, K, f"{name}\nunmasked log-prior K(i, j)")
        title = f"{name}\ncausal prior probability"
        image = causal_heatmap(fig, ax_prob, probs, title, colorbar=False)
        if any(isinstance(m, GOATSink) for m in prior.modules()):
            zoom_on_sink(ax_prob, probs)
    fig.colorbar(image, ax=axes[:, 1], shrink=0.5, label="prior probability (log scale)")
    fig.suptitle(f"Priors of head {head} of {num_heads} over L = {length} positions")
    return save(fig, out / "heatmaps.png")


def plot_priors(out: Path, length: int = 512, num_heads: int = 8, head: int = 0) -> list[Path]:
    """Every figure above, written to ``out`` (created if missing)."""
    return [
        plot(Path(out), length, num_heads, head)
        for plot in (plot_prior_curves, plot_goat_decomposition, plot_heatmaps)
    ]
