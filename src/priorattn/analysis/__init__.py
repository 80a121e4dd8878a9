"""Looking at priors and runs: log-priors, the probabilities they induce, training curves."""

from .plots import (
    plot_goat_decomposition,
    plot_heatmaps,
    plot_prior_curves,
    plot_priors,
    prior_curve,
)
from .runs import plot_runs

__all__ = [
    "plot_goat_decomposition",
    "plot_heatmaps",
    "plot_prior_curves",
    "plot_priors",
    "plot_runs",
    "prior_curve",
]
