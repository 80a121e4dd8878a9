"""Priors: each a small Module with a dense ``log_prior`` and, where it can, a fold into q/k lanes.

Each prior's file registers it by name with its options (:mod:`.registry`), so a prior is a spec
as plain data (:mod:`.spec`): ``build_prior("goat(num_freqs=4)+alibi", num_heads)``, ``prior.spec()``.
"""

from .alibi import ALiBi
from .base import FoldLanes, Prior, ScaledLag
from .fire import FIRE
from .ggd import GGD
from .goat import GOAT, GOATSink
from .kerple import KERPLE
from .math import alibi_slopes
from .registry import CONTEXT, Choice, FromModel, Option, names, options, register, registered
from .sandwich import Sandwich
from .spec import build_prior, canonical_spec, read_spec, with_defaults
from .sum import Sum
from .t5 import T5Bias
from .uniform import Uniform

__all__ = [
    "ALiBi",
    "CONTEXT",
    "Choice",
    "FIRE",
    "FoldLanes",
    "FromModel",
    "GGD",
    "GOAT",
    "GOATSink",
    "KERPLE",
    "Option",
    "Prior",
    "Sandwich",
    "ScaledLag",
    "Sum",
    "T5Bias",
    "Uniform",
    "alibi_slopes",
    "build_prior",
    "canonical_spec",
    "names",
    "options",
    "read_spec",
    "register",
    "registered",
    "with_defaults",
]
