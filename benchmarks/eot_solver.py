"""Every closed-form map of the variational family against the numerical solver (seed 004 Sec. 4).

For each regularizer, 64 rows of 32 keys (scores ~ N(0, 2^2), about a third of the keys masked, one
row seeing a single key) are solved by ``priorattn.eot.solve`` with ``Omega`` written out as a plain
function of ``p``; this prints the largest difference to the closed form, the largest duality gap,
the iterations and the time.

    python benchmarks/eot_solver.py
"""

from __future__ import annotations

import math
import time

import torch

from priorattn.eot import KLToPrior, Locality, Shannon, Tsallis, solve

ROWS, KEYS = 64, 32


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(ROWS, KEYS, generator=gen, dtype=torch.float64) * 2
    visible = torch.rand(ROWS, KEYS, generator=gen) > 1 / 3
    visible[:, 0] = True
    visible[1, 1:] = False
    log_prior = torch.randn(ROWS, KEYS, generator=gen, dtype=torch.float64)
    distance = (torch.arange(KEYS)[None] - torch.randint(0, KEYS, (ROWS, 1), generator=gen)).abs().double()
    pi = torch.where(visible, log_prior.exp(), 0.0)
    pi = pi / pi.sum(-1, keepdim=True)

    def xlogx(p):
        return torch.special.xlogy(p, p).sum(-1)

    cases = [
        ("Shannon(tau=0.5)", Shannon(0.5), lambda p: 0.5 * xlogx(p)),
        (
            "KLToPrior(tau=2)",
            KLToPrior(log_prior, 2.0),
            lambda p: 2 * (xlogx(p) - torch.special.xlogy(p, pi).sum(-1)),
        ),
        ("sparsemax: 1/2 ||p||^2", Tsallis(2.0), lambda p: 0.5 * (p * p).sum(-1)),
        ("entmax alpha=1.5", Tsallis(1.5), lambda p: (p**1.5 - p).sum(-1) / 0.75),
        ("entmax alpha=1.25", Tsallis(1.25), lambda p: (p**1.25 - p).sum(-1) / (1.25 * 0.25)),
        ("entmax alpha=4", Tsallis(4.0), lambda p: (p**4 - p).sum(-1) / 12),
        ("Locality(gamma=0.2)", Locality(0.2, distance), lambda p: xlogx(p) + 0.2 * (p * distance).sum(-1)),
    ]
    print(f"{'regularizer':<24} {'max |closed - solver|':>22} {'max gap':>9} {'iterations':>10} {'time':>7}")
    for name, omega, written_out in cases:
        start = time.perf_counter()
        solution = solve(scores, written_out, visible)
        seconds = time.perf_counter() - start
        error = (omega.normalize(scores, visible) - solution.p).abs().max().item()
        gap = solution.gap.max().item()
        print(f"{name:<24} {error:>22.2e} {gap:>9.1e} {solution.iterations:>10} {seconds:>6.2f}s")
    assert math.isfinite(error)


if __name__ == "__main__":
    main()
