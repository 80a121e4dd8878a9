"""What the DNA study measures on a generated continuation: its match to the true sequence, the GC% of
its sliding windows and how well that tracks the truth's (seed 000 Fig. 4c)."""

from __future__ import annotations

import statistics

import numpy as np


def match_rate(generated: str, truth: str) -> float:
    """The fraction of positions where ``generated`` has ``truth``'s base (seed 000 Fig. 4c colours)."""
    if len(generated) != len(truth) or not truth:
        raise ValueError(
            f"match_rate needs sequences of one non-zero length, got {len(generated)}, {len(truth)}"
        )
    return sum(a == b for a, b in zip(generated, truth)) / len(truth)


def gc_trajectory(sequence: str, window: int) -> np.ndarray:
    """GC% of each window of ``window`` bases sliding by one: ``len - window + 1`` values in [0, 100]."""
    if not 1 <= window <= len(sequence):
        raise ValueError(f"window must be in [1, {len(sequence)}] (the sequence's length), got {window}")
    gc = np.array([base in "GC" for base in sequence.upper()], dtype=np.float64)
    return 100 * np.convolve(gc, np.ones(window), mode="valid") / window


def pearson(x: np.ndarray, y: np.ndarray) -> float | None:
    """Pearson's r of two equally long series; ``None`` where one is constant (r is undefined)."""
    if x.std() == 0 or y.std() == 0:
        return None
    return float(np.corrcoef(x, y)[0, 1])


def nan_mean(values: list[float | None]) -> float | None:
    defined = [v for v in values if v is not None]
    return statistics.mean(defined) if defined else None
