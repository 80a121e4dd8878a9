"""Figure helpers every study draws with: a figure with a caption under its panels, a heatmap of a
query-by-key matrix, and saving. Figures are :class:`matplotlib.figure.Figure` objects built directly
(no pyplot), so nothing touches a display or a global backend."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure


def save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def captioned_figure(figsize: tuple[float, float], caption: str, fontsize: float = 10.0):
    """A figure with ``caption`` under its panels: ``(fig, panel)``, draw on ``panel`` (a subfigure
    of ``figsize`` with its own constrained layout), save ``fig``.

    Paragraphs of ``caption`` are separated by blank lines; the figure grows to fit the wrapped text.
    """
    width, height = figsize
    chars = int(width * 72 / (0.56 * fontsize))  # about 0.56 em per character of DejaVu Sans
    body = "\n\n".join(textwrap.fill(" ".join(p.split()), chars) for p in caption.strip().split("\n\n"))
    extra = (body.count("\n") + 1) * fontsize * 1.25 / 72 + 0.25  # inches
    fig = Figure(figsize=(width, height + extra), layout="constrained")
    panel, below = fig.subfigures(2, 1, height_ratios=[height, extra])
    below.text(0.01, 0.97, body, ha="left", va="top", fontsize=fontsize)
    return fig, panel


def heatmap(fig: Figure, ax, values: np.ndarray, title: str, colorbar: str | None = None, **kwargs):
    """Draw ``values: (Lq, Lk)`` with queries down and keys across; a colorbar labelled
    ``colorbar`` if given. Returns the image, for a colorbar shared by several panels."""
    image = ax.imshow(values, interpolation="nearest", aspect="equal", **kwargs)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("key position j (the token attended to)")
    ax.set_ylabel("query position i (the token attending)")
    if colorbar:
        fig.colorbar(image, ax=ax, shrink=0.85, label=colorbar)
    return image
