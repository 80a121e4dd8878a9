"""Experiment 7: a search over the regularizer weights, for a fair test of seed 002's claim that the
regularizers ("Regularization for Efficient Inference") make a sorted cache's window hold the
attention mass.

Experiment 3 tried one set of weights (align 0.1, spread 0.01 from a third of the steps, tau 0.01)
and found every regularized hybrid capturing less mass than the unregularized one. Here hybrids
are trained alike over a :class:`Grid` of weights, spread ranges and spread schedules, plus the
unregularized baseline; each is measured as in experiment 3 (val loss, final tau, key spread, mass
on the k nearest scalar keys). The baseline and the :data:`CONFIRM` settings with the most mass on
the Pareto front of (val loss, mass at the smallest k) within :data:`LOSS_BOUND` of the baseline's
loss are trained again at the next seed. See docs/scalar_experiments.md, experiment 7.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from pathlib import Path

from ...figures import RunScale
from ...scalar.regularizers import Regularization
from .common import (
    MASS_KS,
    Settings,
    Variant,
    mass_summary,
    metric_curve,
    save_figure,
    summary,
    train_variant,
    window_maps,
)
from .regularizer_ablation import scalar_space

#: The loss a setting may cost over the unregularized hybrid and still count as "bounded": twice
#: the largest seed-to-seed spread of one model in experiments 1 and 3 (0.010 nats per byte).
LOSS_BOUND = 0.02
#: How many of the front's settings (most mass first) are trained again at the next seed.
CONFIRM = 2


@dataclass(frozen=True)
class Setting:
    """One point of the search: the three weights, the spread term's range (``None``: adaptive,
    ``mean +- 3 std``) and the fraction of the steps after which it starts."""

    align: float = 0.0
    spread: float = 0.0
    tau: float = 0.0
    spread_range: tuple[float, float] | None = (-3.0, 3.0)
    spread_start: float = 0.0

    def __post_init__(self):
        Regularization(self.align, self.spread, self.tau, spread_range=self.spread_range)  # checks
        start = self.spread_start
        if isinstance(start, bool) or not isinstance(start, (int, float)) or not 0 <= start < 1:
            raise ValueError(f"spread_start must be a fraction of the steps in [0, 1), got {start!r}")

    @property
    def name(self) -> str:
        if not Regularization(self.align, self.spread, self.tau).active:
            return "none"
        parts = [f"align{self.align:g}"] if self.align else []
        if self.spread:
            where = "adaptive" if self.spread_range is None else "range{:g}to{:g}".format(*self.spread_range)
            start = f"-from{self.spread_start:g}" if self.spread_start else ""
            parts.append(f"spread{self.spread:g}-{where}{start}")
        return "_".join(parts + ([f"tau{self.tau:g}"] if self.tau else []))

    def variant(self, settings: Settings, suffix: str = "") -> Variant:
        """The hybrid trained with these regularizers at ``settings``, in ``runs/NAME{suffix}``."""
        fields = dict(
            reg_align=self.align,
            reg_spread=self.spread,
            reg_tau=self.tau,
            reg_spread_range=self.spread_range,
            reg_spread_start=round(self.spread_start * settings.steps),
        )
        return Variant(self.name + suffix, self.name, dict(attention="hybrid"), options=fields)


BASELINE = Setting()


@dataclass(frozen=True)
class Grid:
    """Every combination of the axes (a setting without ``L_spread`` once, whatever its range and
    start), plus the unregularized baseline."""

    align: tuple[float, ...] = (0.0, 0.01)
    spread: tuple[float, ...] = (0.0, 0.1)
    tau: tuple[float, ...] = (0.0, 0.1)
    spread_range: tuple[tuple[float, float] | None, ...] = ((-3.0, 3.0), (-6.0, 6.0), None)
    spread_start: tuple[float, ...] = (0.0,)

    def settings(self) -> list[Setting]:
        axes = dict(self.__dict__)
        empty = [name for name, values in axes.items() if not values]
        if empty:
            raise ValueError(f"the search grid's {empty[0]} axis is empty: give it at least one value")
        points = [Setting(**dict(zip(axes, values))) for values in itertools.product(*axes.values())]
        points = [
            p if p.spread else replace(p, spread_range=BASELINE.spread_range, spread_start=0.0)
            for p in points
        ]
        return list(dict.fromkeys([BASELINE, *points]))  # in grid order, each once


#: The default search: 16 hybrids and 3 confirmation runs, 40-50 minutes at budget 1 on the shared
#: 2-core machine (load average 8-12).
GRID = Grid()


def pareto_front(points: dict[str, tuple[float, float]]) -> list[str]:
    """The names of ``points`` (``name -> (loss, mass)``) no other point beats: none has a loss as
    low and a mass as high, one of them strictly. Lowest loss first."""
    for name, (loss, mass) in points.items():
        if not (math.isfinite(loss) and math.isfinite(mass)):
            raise ValueError(f"setting {name!r} has no finite (loss, mass): got ({loss!r}, {mass!r})")

    def beaten(a: tuple[float, float]) -> bool:
        return any(b[0] <= a[0] and b[1] >= a[1] and b != a for b in points.values())

    return sorted((n for n, p in points.items() if not beaten(p)), key=lambda n: points[n])


def measure(setting: Setting, settings: Settings, out: Path, suffix: str, *, progress: bool, log) -> dict:
    """Train ``setting``'s hybrid and record what the search compares."""
    variant = setting.variant(settings, suffix)
    trained = train_variant(variant, settings, out, progress=progress, log=log)
    maps = window_maps(trained.run_dir, settings)
    tau_curve = metric_curve(trained.run_dir, "tau")
    return summary(variant, trained) | dict(
        weights=dict(setting.__dict__),
        tau=tau_curve["tau"][-1],
        tau_curve=tau_curve,
        mass_captured=mass_summary(maps),
        scalar_space=scalar_space(maps),
    )


def fronts(results: dict[str, dict], settings: Settings) -> dict[str, list[str]]:
    """The Pareto front of (val loss, mass on the k nearest keys) at each k below the windows'
    length (a larger k reads every key), keyed by ``str(k)``."""
    return {
        str(k): pareto_front(
            {n: (r["val_loss"], r["mass_captured"]["nearest"][str(k)]) for n, r in results.items()}
        )
        for k in MASS_KS
        if k < settings.seq_len
    }


def to_confirm(results: dict[str, dict], front: list[str]) -> list[str]:
    """The baseline and the :data:`CONFIRM` settings of ``front`` with the most mass among those
    within :data:`LOSS_BOUND` of the baseline's loss."""
    bound = results[BASELINE.name]["val_loss"] + LOSS_BOUND
    k = str(MASS_KS[0])
    within = [n for n in front if n != BASELINE.name and results[n]["val_loss"] <= bound]
    best = sorted(within, key=lambda n: -results[n]["mass_captured"]["nearest"][k])[:CONFIRM]
    return [BASELINE.name, *best]


def search(grid: Grid, settings: Settings, out: Path, *, progress: bool = True, log=print) -> dict:
    """Train and measure every setting of ``grid`` at ``settings``, then the front's best at the
    next seed; the results and the Pareto figure."""
    points = {s.name: s for s in grid.settings()}
    results = {name: measure(s, settings, out, "", progress=progress, log=log) for name, s in points.items()}
    by_k = fronts(results, settings)
    replicate = replace(settings, seed=settings.seed + 1)
    suffix = f"-seed{replicate.seed}"
    confirmed = {
        name: measure(points[name], replicate, out, suffix, progress=progress, log=log)
        for name in to_confirm(results, by_k[str(MASS_KS[0])])
    }
    figures = [plot_pareto(results, by_k, confirmed, out, "pareto.png", run=settings.scale)]
    return dict(
        variants=results,
        pareto_fronts=by_k,
        loss_bound=LOSS_BOUND,
        confirmation=dict(seed=replicate.seed, variants=confirmed),
        mass_ks=list(MASS_KS),
        figures=figures,
    )


def run(settings: Settings, out: Path, *, progress: bool = True, log=print) -> dict:
    return search(GRID, settings, out, progress=progress, log=log)


#: How far above the baseline's loss the panels reach; a costlier setting is drawn at the top edge.
SHOWN_LOSS = 3 * LOSS_BOUND

CAPTION = (
    "Hybrid tiny models trained alike except for the seed 002 regularizers (experiment 7's grid of "
    "weights, spread ranges and schedules), on validation windows of the training length: validation "
    "loss against the mass on the k keys nearest each query in scalar distance (what a sorted cache "
    "reading k keys holds). Down and to the right is better: the line joins the Pareto front "
    "(named in the first panel), the star is the unregularized hybrid, the dashed line its loss + "
    "{bound} nats (the loss bound), the dotted line the mass of k keys at random, hollow markers the "
    "confirmation seed's runs of the baseline and the front's best. Triangles at the top edge: "
    "settings that cost more than {shown} nats, their loss in results.json."
)


def plot_pareto(
    results: dict[str, dict],
    by_k: dict[str, list[str]],
    confirmed: dict[str, dict],
    out: Path,
    name: str,
    *,
    run: RunScale,
) -> str:
    from ...figures import captioned_figure

    fig, panel = captioned_figure((14, 4.6), CAPTION.format(bound=LOSS_BOUND, shown=SHOWN_LOSS), run=run)
    axes = panel.subplots(1, len(by_k), sharey=True)
    baseline = results[BASELINE.name]
    top = baseline["val_loss"] + SHOWN_LOSS

    def point(entry: dict, k: str) -> tuple[float, float]:
        return entry["mass_captured"]["nearest"][k], min(entry["val_loss"], top)

    def scatter(ax, entries: list[dict], k: str, **style) -> None:
        for above in (False, True):
            chosen = [point(e, k) for e in entries if (e["val_loss"] > top) == above]
            if chosen:
                ax.scatter(*zip(*chosen), marker="^" if above else style.pop("marker", "o"), **style)

    for i, (ax, (k, front)) in enumerate(zip(axes, by_k.items())):
        scatter(ax, list(results.values()), k, color="0.6", s=18)
        ax.plot(*zip(*[point(results[n], k) for n in front]), color="C0", label="Pareto front")
        scatter(ax, [results[n] for n in front], k, color="C0", s=18)
        if i == 0:
            for j, n in enumerate(front):
                offset = (4, -8 + 6 * (j % 4))  # neighbours on the front get different heights
                ax.annotate(n, point(results[n], k), xytext=offset, textcoords="offset points", fontsize=6)
        scatter(ax, list(confirmed.values()), k, facecolors="none", edgecolors="C1", s=40, label="next seed")
        ax.scatter(*point(baseline, k), marker="*", s=120, color="C3", label="no regularizer", zorder=3)
        ax.axhline(baseline["val_loss"] + LOSS_BOUND, color="0.4", linestyle="--", linewidth=1)
        ax.axvline(baseline["mass_captured"]["chance"][k], color="0.4", linestyle=":", linewidth=1)
        ax.set(xlabel=f"mass on the {k} nearest scalar keys", title=f"k = {k}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("validation loss (nats per byte)")
    axes[-1].legend(fontsize=8, loc="lower left")
    panel.suptitle("Experiment 7: regularizer weights, loss against the mass a sorted cache reads")
    return save_figure(fig, out, name)
