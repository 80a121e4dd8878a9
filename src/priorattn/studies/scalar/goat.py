"""Seed 002 experiment 6: "Implement GOAT's prior-augmented attention and compare [...] GOAT adds a
positional prior; the hybrid adds a content-derived scalar prior. Are they complementary? Can both
be combined?"

Four tiny models trained alike: standard dot-product attention (no positional information, the
preset's), GOAT (seed 000's prior on the same heads), the hybrid, and the hybrid with GOAT's prior
(both terms in one score, one SDPA call: docs/scalar.md). Complementary would mean the hybrid + GOAT
beats both GOAT and the hybrid.
"""

from __future__ import annotations

from pathlib import Path

from ...figures import RunScale, seed_expectation
from .common import Settings, Variant, compare_variants

VARIANTS = (
    Variant("standard", "standard (no positions)", dict(attention="standard")),
    Variant("goat", "GOAT", dict(attention="standard", prior="goat")),
    Variant("hybrid", "hybrid", dict(attention="hybrid")),
    Variant("hybrid_goat", "hybrid + GOAT", dict(attention="hybrid", prior="goat")),
)

CAPTION = (
    "Validation loss of four tiny models trained alike: dot-product attention without positional "
    "information, with GOAT's learnt positional prior, the hybrid (dot product + scalar kernel), and "
    "the hybrid with GOAT's prior."
)
MASS_CAPTION = (
    "The two hybrids, on validation windows of the training length: the fraction of a query's "
    "attention mass on k of its keys (mean over layers, heads and the queries that see more than k "
    "keys). With GOAT's prior, position carries part of the score, which may pull mass away from "
    "the scalar neighbours."
)


def expectation(variants: dict[str, dict], run: RunScale) -> str:
    """Seed 002's question ("Are they complementary?"), judged on the final validation losses: the
    two are complementary here when hybrid + GOAT ends below both GOAT and the hybrid."""
    both, goat, hybrid = (variants[name]["val_loss"] for name in ("hybrid_goat", "goat", "hybrid"))
    measured = (
        f"hybrid + GOAT ends at {both:.3f} nats per byte, GOAT at {goat:.3f}, the hybrid at "
        f"{hybrid:.3f} (one seed)"
    )
    return seed_expectation(
        "Seed 002 asks whether GOAT's positional prior and the hybrid's content scalar term are "
        "complementary: if they are, hybrid + GOAT ends below both GOAT and the hybrid.",
        both < min(goat, hybrid),
        measured,
        run,
    )


def run(settings: Settings, out: Path, *, progress: bool = True, log=print) -> dict:
    title = "Experiment 6: GOAT and the scalar term"
    captions = (CAPTION, MASS_CAPTION)
    return compare_variants(VARIANTS, settings, out, title, captions, expectation, progress=progress, log=log)
