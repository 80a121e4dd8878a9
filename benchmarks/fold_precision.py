"""How exact is a folded key-linear slope (ALiBi, GOAT's recency term) at long positions?

Under a causal mask ALiBi's ``-m (i - j)`` folds into SDPA as the key-linear lane ``m j`` (seed 000
Prop. F.6). ``m j`` grows with the position and swamps the content score in floating point, so the
SDPA route re-centres the lane on each run of queries, and runs are capped so that ``m * run`` stays
below ``SLOPE_MAGNITUDE[dtype]``. This prints, for several caps, the largest output error of the
SDPA route against the float64 reference, next to plain SDPA's own float32 error and time.

    python benchmarks/fold_precision.py [--length 4096] [--offset 1000000]
"""

from __future__ import annotations

import argparse
import time

import torch

import priorattn
from priorattn.functional import prior_inputs
from priorattn.priors import ALiBi


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--offset", type=int, default=1_000_000, help="position of the first token")
    parser.add_argument("--heads", type=int, default=8)
    args = parser.parse_args()
    torch.manual_seed(0)
    H, L = args.heads, args.length
    q, k, v = (torch.randn(1, H, L, 64, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(args.offset, args.offset + L)
    exact = priorattn.attention(q, k, v, prior=ALiBi(H).double(), q_pos=pos, k_pos=pos, backend="reference")
    plain_exact = priorattn.attention(q, k, v, backend="reference")
    start = time.perf_counter()
    plain = priorattn.attention(q.float(), k.float(), v.float(), backend="sdpa")
    plain_s = time.perf_counter() - start
    plain_err = (plain.double() - plain_exact).abs().max().item()
    print(f"L={L}, positions from {args.offset}, ALiBi({H}) slopes up to {ALiBi(H).slopes.max().item():g}")
    print(f"plain SDPA, float32: max error {plain_err:.2e}, {plain_s:.3f} s forward")
    print("| cap on m * run (float32) | queries per call | max error vs float64 | forward s |")
    print("|---:|---:|---:|---:|")
    default = prior_inputs.SLOPE_MAGNITUDE[torch.float32]
    for log2 in (6, 8, 10, 12, 30):
        prior_inputs.SLOPE_MAGNITUDE[torch.float32] = 2.0**log2
        run = prior_inputs.slope_span(ALiBi(H).slope_bound(), torch.float32)
        start = time.perf_counter()
        out = priorattn.attention(
            q.float(), k.float(), v.float(), prior=ALiBi(H), q_pos=pos, k_pos=pos, backend="sdpa"
        )
        seconds = time.perf_counter() - start
        error = (out.double() - exact).abs().max().item()
        mark = " (default)" if 2.0**log2 == default else ""
        print(f"| 2^{log2}{mark} | {min(run, L)} | {error:.2e} | {seconds:.3f} |")
    prior_inputs.SLOPE_MAGNITUDE[torch.float32] = default


if __name__ == "__main__":
    main()
