"""Seed 002 experiment 1: "Replace pure scalar sort with combined score q.k/sqrt(d) - (qs-ks)^2/tau.
No regularizer. Compare to pure sort attention and pure standard attention [...] Expected result:
better than pure sort, likely close to standard attention."

Three tiny models trained alike, differing only in their heads: standard dot-product, pure scalar,
hybrid. Results: their validation curves, and how much attention mass a sorted cache with ``k`` keys
would capture in the two with scalar heads (:func:`~.common.mass_captured`).
"""

from __future__ import annotations

from pathlib import Path

from ...figures import RunScale, seed_expectation
from .common import Settings, Variant, compare_variants

VARIANTS = (
    Variant("standard", "standard (dot product)", dict(attention="standard")),
    Variant("scalar", "pure scalar (sort)", dict(attention="scalar")),
    Variant("hybrid", "hybrid (dot product - (q_s - k_s)^2 / tau)", dict(attention="hybrid")),
)

CAPTION = (
    "Validation loss of three tiny byte-level models trained alike (same data, steps, seed), which "
    "differ only in how a query scores a key: the dot product of standard attention, the Gaussian "
    "kernel of a scalar query and key alone (pure scalar / sort attention), or both added (hybrid). "
    "No regularizer."
)

MASS_CAPTION = (
    "The two models with scalar heads, on validation windows of the training length: the fraction of "
    "a query's attention mass on k of its keys (mean over layers, heads and the queries that see more "
    "than k keys). 1 - solid is a sorted cache's approximation error. No regularizer trained the "
    "scalar order; pure scalar weights fall with scalar distance alone, so its dotted line is its solid one."
)


def expectation(variants: dict[str, dict], run: RunScale) -> str:
    """Seed 002's expected result, judged on the final validation losses: the hybrid below pure
    scalar, and closer to standard than to pure scalar ("likely close to standard attention")."""
    hybrid, scalar, standard = (variants[name]["val_loss"] for name in ("hybrid", "scalar", "standard"))
    agrees = hybrid < scalar and abs(hybrid - standard) < abs(hybrid - scalar)
    measured = (
        f"the hybrid ends at {hybrid:.3f} nats per byte, pure scalar at {scalar:.3f}, standard at "
        f"{standard:.3f} (one seed)"
    )
    return seed_expectation(
        "Seed 002 expects the hybrid to beat pure scalar and come close to standard (here: closer to "
        "standard than to pure scalar).",
        agrees,
        measured,
        run,
    )


def run(settings: Settings, out: Path, *, progress: bool = True, log=print) -> dict:
    title = "Experiment 1: scalar, hybrid, standard"
    captions = (CAPTION, MASS_CAPTION)
    return compare_variants(VARIANTS, settings, out, title, captions, expectation, progress=progress, log=log)
