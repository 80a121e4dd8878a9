"""Looking at priors: figures of their log-priors and the probabilities they induce."""

from .plots import (
    plot_goat_decomposition,
    plot_heatmaps,
    plot_prior_curves,
    plot_priors,
    prior_curve,
)

__all__ = [
    "plot_goat_decomposition",
    "plot_heatmaps",
    "plot_prior_curves",
    "plot_priors",
    "prior_curve",
]
