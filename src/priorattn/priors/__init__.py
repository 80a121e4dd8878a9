"""Priors: each a small Module with a dense ``log_prior`` and, where it can, a fold into q/k lanes.

Each prior's file registers it by name with its options (:mod:`.registry`), so a prior is a spec
as plain data (:mod:`.spec`): ``build_prior("goat(num_freqs=4)+alibi", num_heads)``, ``prior.spec()``.

Every module of this package but those of :data:`INFRASTRUCTURE` is a prior's file: importing the
package imports each (:data:`PRIOR_MODULES`), so its ``register(...)`` runs, and exports the names of
its ``__all__``. A new prior is a new file here, with no edit of this one.
"""

import importlib
import pkgutil

from .base import FoldLanes, Prior, ScaledLag
from .math import alibi_slopes
from .registry import CONTEXT, Choice, FromModel, Option, names, options, register, registered
from .spec import build_prior, canonical_spec, read_spec, with_defaults
from .sum import Sum

#: The modules of this package that are not priors: the contract every prior follows, the math
#: several share, the registry, specs, sums of priors and FlexAttention's ``score_mod``.
INFRASTRUCTURE = ("base", "math", "registry", "score_mod", "spec", "sum")
#: Every other module: a prior's file, imported here (sorted by name).
PRIOR_MODULES = tuple(
    sorted(info.name for info in pkgutil.iter_modules(__path__) if info.name not in INFRASTRUCTURE)
)

__all__ = [
    "CONTEXT",
    "Choice",
    "FoldLanes",
    "FromModel",
    "Option",
    "Prior",
    "ScaledLag",
    "Sum",
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


def _import_prior_modules() -> list[str]:
    """Import every prior's file (its ``register(...)`` runs) and bring the names of its ``__all__``
    here; those names."""
    exported = []
    for name in PRIOR_MODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        for public in getattr(module, "__all__", ()):
            globals()[public] = getattr(module, public)
            exported.append(public)
    return exported


__all__ = sorted(__all__ + _import_prior_modules())
