"""Figure helpers every study draws with: a figure with a caption under its panels, a heatmap of a
query-by-key matrix, and saving; and what every study says about its own run: how much it trained
(:class:`RunScale`, in its results and at the top of its figures) and whether it agrees with what a
seed expects (:func:`seed_expectation`, in its captions). Figures are
:class:`matplotlib.figure.Figure` objects built directly (no pyplot), so nothing touches a display
or a global backend."""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.figure import Figure

#: Dots per inch of every saved figure.
DPI = 110
#: Inches of the widest figure a report page shows at its own size: the page's column is 1200 px
#: wide less its padding (``eval/pages.py``), 1166 px at :data:`DPI`. A wider figure is shrunk, and
#: its text with it.
PAGE_WIDTH = 10.6
#: Font sizes (points) and line widths for a figure of :data:`PAGE_WIDTH` with several lines, each
#: mechanism's line wide enough to tell its colour and style (:func:`legible`).
LEGIBLE = {
    "font.size": 11,
    "axes.titlesize": 12,
    "axes.labelsize": 11,
    "xtick.labelsize": 10,
    "ytick.labelsize": 10,
    "legend.fontsize": 10,
    "figure.titlesize": 13,
    "lines.linewidth": 2.0,
    "lines.markersize": 6,
}


def legible():
    """A context for drawing and saving a figure with :data:`LEGIBLE` sizes (matplotlib reads them
    as each artist is made)."""
    return matplotlib.rc_context(LEGIBLE)


#: Every study's default ``--budget``.
DEFAULT_BUDGET = 1.0


@dataclass(frozen=True)
class RunScale:
    """How much a study's run trained: ``steps``, each model's optimizer steps (``up_to``: at most
    that many, a model stopping early when it is done), against ``default_steps``, the study's at
    its default budget; ``budget``: the ``--budget`` that gave them (None for a study sized by its
    steps alone).

    A run below the default, in budget or in steps, is a smoke run: it shows that the study runs end
    to end, and its numbers judge nothing. :meth:`record` is what ``results.json`` holds under
    ``"scale"``, :meth:`title` the line at the top of each of the run's figures
    (``captioned_figure(run=...)``).
    """

    steps: int
    default_steps: int
    budget: float | None = None
    up_to: bool = False

    def __post_init__(self):
        for name in ("steps", "default_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        budget = self.budget
        if budget is not None and (
            isinstance(budget, bool) or not isinstance(budget, int | float) or not 0 < budget < math.inf
        ):
            raise ValueError(f"budget must be a positive number or None, got {budget!r}")

    @property
    def smoke(self) -> bool:
        return self.steps < self.default_steps or (self.budget is not None and self.budget < DEFAULT_BUDGET)

    def record(self) -> dict:
        """``{"steps", "default_steps", "budget", "up_to", "smoke"}``."""
        return dict(
            steps=self.steps,
            default_steps=self.default_steps,
            budget=self.budget,
            up_to=self.up_to,
            smoke=self.smoke,
        )

    def title(self) -> str:
        """``"300 training steps per model (budget 1)"``, or for a smoke run ``"SMOKE RUN (budget
        0.1): 30 training steps per model, against 300 at the default budget; its numbers judge
        nothing"``."""
        steps = f"{'up to ' if self.up_to else ''}{self.steps} training steps per model"
        budget = "" if self.budget is None else f" (budget {self.budget:g})"
        if self.smoke:
            default = f"{self.default_steps} at the default budget"
            if self.budget is None:
                default = f"the default {self.default_steps}"
            return f"SMOKE RUN{budget}: {steps}, against {default}; its numbers judge nothing"
        return f"{steps}{budget}"


def seed_expectation(expectation: str, agrees: bool | None, measured: str, run: RunScale) -> str:
    """The sentences a caption states a seed's expectation with: ``expectation`` (a sentence), then
    whether this run agrees, as the caller judged it from the measured numbers (``agrees``; None:
    the numbers cannot tell), with what was ``measured``, and in a smoke run that this judges
    nothing. ``"Seed 002 expects the hybrid to beat pure scalar. This run differs: the hybrid ends
    at 2.41 nats, pure scalar at 2.38."``"""
    verdict = {True: "This run agrees", False: "This run differs", None: "This run cannot tell"}[agrees]
    text = f"{expectation.strip()} {verdict}: {measured.strip().rstrip('.')}."
    if run.smoke:
        text += " (A smoke run: this judges nothing.)"
    return text


def save(fig: Figure, path: Path) -> Path:
    """Write ``fig`` as a PNG at ``path``; its figure-level title (a :class:`RunScale` line) also
    goes into the file's ``Title``, so a figure apart from its ``results.json`` still says how
    much its run trained."""
    path.parent.mkdir(parents=True, exist_ok=True)
    title = fig.get_suptitle()
    fig.savefig(path, dpi=DPI, metadata={"Title": title} if title else None)
    return path


def captioned_figure(
    figsize: tuple[float, float], caption: str, fontsize: float = 10.0, *, run: RunScale | None = None
):
    """A figure with ``caption`` under its panels: ``(fig, panel)``, draw on ``panel`` (a subfigure
    of ``figsize`` with its own constrained layout), save ``fig``.

    Paragraphs of ``caption`` are separated by blank lines; the figure grows to fit the wrapped text.
    ``run``: the study run the figure shows; its :meth:`RunScale.title` goes above the panels (red
    for a smoke run).
    """
    width, height = figsize
    body = "\n\n".join(_wrap(p, width, fontsize) for p in caption.strip().split("\n\n"))
    extra = (body.count("\n") + 1) * fontsize * 1.25 / 72 + 0.25  # inches
    fig = Figure(figsize=(width, height + extra), layout="constrained")
    if run is not None:
        bold = 1.1  # bold DejaVu Sans is about a tenth wider
        title = _wrap(run.title(), width / bold, fontsize + 1)
        style = dict(color="#c00000", fontweight="bold") if run.smoke else dict(color="0.3")
        fig.suptitle(title, fontsize=fontsize + 1, **style)
    panel, below = fig.subfigures(2, 1, height_ratios=[height, extra])
    below.text(0.01, 0.97, body, ha="left", va="top", fontsize=fontsize)
    return fig, panel


def _wrap(text: str, width: float, fontsize: float) -> str:
    """``text`` wrapped to lines that fit ``width`` inches at ``fontsize`` points."""
    chars = int(width * 72 / (0.56 * fontsize))  # about 0.56 em per character of DejaVu Sans
    return textwrap.fill(" ".join(text.split()), chars)


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
