"""Verdicts that hold up to noise: a measurement is a point with a 95% interval, and a claim or a
win is declared only where the interval leaves no other answer.

- :class:`Estimate`: a value with its interval ``[low, high]``;
- :func:`wilson_interval` for a share of successes (exact-match accuracy over prompts),
  :func:`seed_interval` for a share pooled over seeds that keeps their spread in it,
  :func:`normal_interval` for a mean with a standard error, :func:`mean_interval` for the mean of
  independent values (seeds, windows);
- :func:`compare_to`: is an estimate above a threshold, below it, or within noise of it;
- :func:`winner`: the best of several estimates, or the tie of those not separated from it.

The rule of :func:`winner` is that 95% intervals do not overlap. It is conservative: two estimates
with equal standard errors must differ by ``2 z se`` rather than ``sqrt(2) z se`` (a test at about
the 0.6% level, not 5%), so a declared win is a clear one, and a close call is reported as a tie.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile: two-sided 95% intervals


@dataclass(frozen=True)
class Estimate:
    """A measured ``value`` and its interval ``low <= value <= high`` (a bound may be infinite:
    one measurement says nothing about its spread)."""

    value: float
    low: float
    high: float

    def __post_init__(self):
        if not (math.isfinite(self.value) and self.low <= self.value <= self.high):
            raise ValueError(
                f"an estimate needs a finite value inside its interval, got {self.value!r} in "
                f"[{self.low!r}, {self.high!r}]"
            )

    def text(self, digits: int = 3, signed: bool = False) -> str:
        """``0.500 [0.237, 0.763]``: the value and its interval."""
        spec = f"{'+' if signed else ''}.{digits}f"
        return f"{self.value:{spec}} [{self.low:{spec}}, {self.high:{spec}}]"


def check_z(z: float) -> None:
    if not (isinstance(z, numbers.Real) and 0 < z < math.inf):
        raise ValueError(f"z must be a positive finite number, got {z!r}")


def wilson_interval(successes: int, trials: int, z: float = Z95) -> Estimate:
    """The share ``successes / trials`` with its Wilson score interval (Wilson 1927; Brown, Cai and
    DasGupta 2001): the ``p`` for which ``|successes / trials - p| <= z sqrt(p (1 - p) / trials)``.
    Unlike the normal interval it is never empty at 0 or 1: 0 of 10 gives ``[0, 0.278]``."""
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
        raise ValueError(f"trials must be a positive int, got {trials!r}")
    if not isinstance(successes, int) or isinstance(successes, bool) or not 0 <= successes <= trials:
        raise ValueError(f"successes must be an int in [0, trials={trials}], got {successes!r}")
    check_z(z)
    p, n = successes / trials, trials
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # At 0 or n successes the bound is exactly 0 or 1; rounding must not move it past the value.
    return Estimate(p, min(p, max(0.0, centre - half)), max(p, min(1.0, centre + half)))


#: Replicates of :func:`seed_interval`'s bootstrap: its percentiles move by less than 0.01 (one standard
#: deviation) from one generator to another at this many.
BOOTSTRAP_REPLICATES = 4000


def seed_interval(correct: Sequence[int], trials: int, replicates: int = BOOTSTRAP_REPLICATES) -> Estimate:
    """The share of successes pooled over seeds, ``sum(correct) / (len(correct) * trials)`` (seed ``s``
    got ``correct[s]`` of ``trials``), with a 95% interval that holds the seed-to-seed spread.

    The interval is the union of two: the 2.5% and 97.5% percentiles of a two-stage (cluster)
    bootstrap, which draws ``len(correct)`` seeds with replacement and then each drawn seed's
    ``trials`` sequences with replacement (a binomial draw at that seed's share) and pools them; and
    the Wilson interval of the pooled count (:func:`wilson_interval`), the sequences' noise alone,
    which the bootstrap lacks where every seed got every sequence right (its interval is then
    ``[1, 1]``). Seeds that differ widen it: ``40/40`` and ``22/40`` give about ``[0.47, 1]``, where
    Wilson's pooled interval is ``[0.68, 0.85]``. One seed gives about Wilson's interval: nothing
    is known of the spread between seeds then, which the report says by its count of seeds. The
    bootstrap's generator is seeded by the counts, so the same counts give the same interval.
    """
    counts = list(correct)
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
        raise ValueError(f"trials must be a positive int, got {trials!r}")
    if not counts or any(not isinstance(c, numbers.Integral) or not 0 <= c <= trials for c in counts):
        raise ValueError(f"correct must hold one int in [0, trials={trials}] per seed, got {counts}")
    pooled = wilson_interval(int(sum(counts)), len(counts) * trials)
    rng = np.random.default_rng([trials, *counts])
    shares = np.asarray(counts) / trials  # (S,)
    drawn = shares[rng.integers(0, len(counts), (replicates, len(counts)))]  # (replicates, S)
    low, high = np.quantile(rng.binomial(trials, drawn).mean(axis=1) / trials, [0.025, 0.975])
    return Estimate(pooled.value, min(pooled.low, float(low)), max(pooled.high, float(high)))


def normal_interval(mean: float, se: float, z: float = Z95) -> Estimate:
    """``mean ± z se``: the normal interval of a mean whose standard error is ``se``."""
    if not (isinstance(se, numbers.Real) and 0 <= se < math.inf):
        raise ValueError(f"se must be a finite number >= 0, got {se!r}")
    check_z(z)
    return Estimate(mean, mean - z * se, mean + z * se)


def mean_interval(values: Sequence[float], z: float = Z95) -> Estimate:
    """The mean of independent ``values`` with its normal interval, the standard error being the
    sample standard deviation over ``sqrt(n)``. One value gives the interval ``(-inf, inf)``."""
    values = list(values)
    if not values or not all(isinstance(v, numbers.Real) and math.isfinite(v) for v in values):
        raise ValueError(f"values must be a non-empty list of finite numbers, got {values!r}")
    check_z(z)
    n = len(values)
    mean = sum(values) / n
    if n == 1:
        return Estimate(mean, -math.inf, math.inf)
    variance = sum((v - mean) ** 2 for v in values) / (n - 1)
    return normal_interval(mean, math.sqrt(variance / n), z)


def compare_to(estimate: Estimate, threshold: float) -> str:
    """``"above"`` when the whole interval is above ``threshold``, ``"below"`` when it is below,
    ``"within noise"`` when the interval holds it (the measurement allows either answer)."""
    if estimate.low > threshold:
        return "above"
    if estimate.high < threshold:
        return "below"
    return "within noise"


@dataclass(frozen=True)
class Winner:
    """What :func:`winner` found: ``best``, the name of the winner, or ``None``; ``tied``, when there
    is no winner, the names not separated from the best value (best value first; empty when there
    was nothing to win)."""

    best: str | None
    tied: list[str]


def separated(better: Estimate, worse: Estimate, higher_is_better: bool) -> bool:
    """Whether ``better``'s interval lies wholly on the better side of ``worse``'s."""
    return better.low > worse.high if higher_is_better else better.high < worse.low


def winner(estimates: dict[str, Estimate], higher_is_better: bool, *, nothing: float | None = None) -> Winner:
    """The estimate with the best value wins when its interval is separated from every other's (no
    overlap); otherwise the tie names it and every estimate whose interval overlaps its interval.

    ``nothing``: a value that is no result at all (0 for an accuracy). When every estimate's value
    is ``nothing`` there is nothing to win: ``Winner(None, [])``. A single estimate wins.
    """
    if not estimates:
        raise ValueError("estimates must name at least one estimate, got none")
    if nothing is not None and all(e.value == nothing for e in estimates.values()):
        return Winner(None, [])
    sign = 1 if higher_is_better else -1
    ranked = sorted(estimates, key=lambda name: -sign * estimates[name].value)  # best first, stable
    best = estimates[ranked[0]]
    close = [name for name in ranked[1:] if not separated(best, estimates[name], higher_is_better)]
    if not close:
        return Winner(ranked[0], [])
    return Winner(None, [ranked[0], *close])
