"""The entropic-optimal-transport view of attention (seed 004): attention maps as the solutions of
``argmin_{p in simplex} -<p, s> + Omega(p)``, a numerical solver for any convex ``Omega``, and the
backward pass as a policy gradient checked on trained models (:mod:`priorattn.analysis.identities`), and
the measures and priors the seeds' theorems are stated in (:mod:`~priorattn.eot.measures`,
:mod:`~priorattn.eot.recency`; docs/theory.md)."""

from ..functional.normalizers import NAMES, KLToPrior, Locality, Regularizer, Shannon, Tsallis, regularizer
from .measures import (
    content_position_log_z,
    content_range,
    context_sensitivity,
    sensitivity_bound,
    sink_margin,
)
from .recency import maxent_recency, maxent_recency_rate, mean_lag, recency_prior
from .solver import NotConverged, Solution, check_convex, solve

__all__ = [
    "NAMES",
    "KLToPrior",
    "Locality",
    "NotConverged",
    "Regularizer",
    "Shannon",
    "Solution",
    "Tsallis",
    "check_convex",
    "content_position_log_z",
    "content_range",
    "context_sensitivity",
    "maxent_recency",
    "maxent_recency_rate",
    "mean_lag",
    "recency_prior",
    "regularizer",
    "sensitivity_bound",
    "sink_margin",
    "solve",
]
