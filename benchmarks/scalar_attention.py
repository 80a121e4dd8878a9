"""Forward+backward time and peak memory of scalar and hybrid attention against plain causal SDPA.

For each L, four calls run one forward and one backward pass (B=1, H=4, head width 64, causal,
float32), timed round-robin in one process (median of several rounds, the order rotating):

- ``sdpa``: plain causal SDPA (``priorattn.attention`` without a prior), the baseline;
- ``scalar``: pure scalar attention, the scalar term folded into lanes (``scalar_attention``, auto);
- ``hybrid``: the dot product plus the folded scalar term in one SDPA call;
- ``hybrid_dense``: the hybrid's dense definition (``backend="reference"``), while its L x L
  logits stay under 2 GB.

Peak memory is the peak RSS of a fresh subprocess (``--one NAME L``) running one forward+backward
(interpreter and torch included).

    python benchmarks/scalar_attention.py                # L = 1024 4096
    python benchmarks/scalar_attention.py --lengths 512  # a sanity run
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import priorattn
from priorattn.scalar import scalar_attention

B, H, D = 1, 4, 64
NAMES = ("sdpa", "scalar", "hybrid", "hybrid_dense")
DENSE_LIMIT_GB = 2.0


def problem(L: int):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, generator=gen).requires_grad_() for _ in range(3))
    q_s, k_s = (torch.randn(B, H, L, generator=gen).requires_grad_() for _ in range(2))
    return q, k, v, q_s, k_s


def step(name: str, q, k, v, q_s, k_s) -> None:
    if name == "sdpa":
        out = priorattn.attention(q, k, v)
    elif name == "scalar":
        out = scalar_attention(q_s, k_s, v, 0.5)
    else:
        backend = "reference" if name == "hybrid_dense" else "auto"
        out = scalar_attention(q_s, k_s, v, 0.5, q=q, k=k, backend=backend)
    out.sum().backward()


def runs(name: str, L: int) -> bool:
    return name != "hybrid_dense" or 3 * 4 * B * H * L * L / 1e9 < DENSE_LIMIT_GB  # logits, probs, grads


def one(name: str, L: int) -> None:
    """Subprocess: one forward+backward, then print the peak RSS in MB.

    Read from ``VmHWM`` (Linux): ``ru_maxrss`` of a child starts at its parent's peak at fork time.
    """
    step(name, *problem(L))
    status = Path("/proc/self/status").read_text()
    print(int(next(line for line in status.splitlines() if line.startswith("VmHWM")).split()[1]) / 1024)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--one", nargs=2, metavar=("NAME", "L"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        return one(args.one[0], int(args.one[1]))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, B={B} H={H} D={D}, causal, fp32")
    print("| L | route | fwd+bwd ms | vs sdpa | peak RSS MB |")
    print("|---:|---|---:|---:|---:|")
    for L in args.lengths:
        names = [name for name in NAMES if runs(name, L)]
        inputs = problem(L)
        times = {name: [] for name in names}
        for r in range(args.rounds + 1):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                start = time.perf_counter()
                step(name, *inputs)
                if r:  # round 0 warms up
                    times[name].append(time.perf_counter() - start)
        base = statistics.median(times["sdpa"])
        for name in names:
            cmd = [sys.executable, __file__, "--one", name, str(L)]
            rss = float(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.split()[-1])
            ms = statistics.median(times[name]) * 1e3
            print(f"| {L} | {name} | {ms:.1f} | {ms / 1e3 / base:.2f}x | {rss:.0f} |")


if __name__ == "__main__":
    main()
