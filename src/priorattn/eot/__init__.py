"""The entropic-optimal-transport view of attention (seed 004): attention maps as the solutions of
``argmin_{p in simplex} -<p, s> + Omega(p)``, a numerical solver for any convex ``Omega``, and the
backward pass as a policy gradient checked on trained models (:mod:`priorattn.eot.identities`)."""

from .regularizers import NAMES, KLToPrior, Locality, Regularizer, Shannon, Tsallis, regularizer
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
    "regularizer",
    "solve",
]
