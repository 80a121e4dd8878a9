"""Priors: each a small Module with a dense ``log_prior`` and, where it can, a fold into q/k lanes."""

from .alibi import ALiBi
from .base import FoldLanes, Prior, alibi_slopes
from .ggd import GGD
from .goat import GOAT, GOATSink
from .sum import Sum
from .uniform import Uniform

__all__ = [
    "ALiBi",
    "FoldLanes",
    "GGD",
    "GOAT",
    "GOATSink",
    "Prior",
    "Sum",
    "Uniform",
    "alibi_slopes",
]
