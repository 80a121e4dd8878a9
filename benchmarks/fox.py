"""FoX through the ``sdpa`` route against plain causal SDPA: forward+backward time and peak memory.

FoX's forget gates enter :func:`priorattn.attention` as ``key_bias = -F_j`` (float64, as
:class:`priorattn.layers.ForgetGate` hands it, with its gradient); plain causal SDPA is the same call
without it. B=1, H=4, head width 64, gates ``sigmoid(N(0, 1) + 2)``. Times: the two routes
alternate in one process, ``--rounds`` rounds, medians and their ratio; on one thread
(``--threads 1``) a sample is the process's CPU time (steadier on a shared machine, as
``goat_package.py``), else wall time. Peak memory: each route runs once at L in a fresh process under
``/usr/bin/time -v`` (maximum resident set size).

    python benchmarks/fox.py --lengths 4096 16384 --dtypes fp32 bf16
    python benchmarks/fox.py --lengths 4096 --threads 1 --rounds 5
    python benchmarks/fox.py --one fox 16384 fp32      # one run, for /usr/bin/time -v
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch

import priorattn

B, H, D = 1, 4, 64
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def inputs(L: int, dtype: torch.dtype, fox: bool):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, generator=gen).to(dtype).requires_grad_() for _ in range(3))
    gates = (torch.randn(B, H, L, generator=gen, dtype=torch.float64) + 2).requires_grad_()
    return q, k, v, gates if fox else None


def step(q, k, v, gates) -> None:
    """One forward and backward pass; FoX's key bias is built inside it, as a layer builds it."""
    key_bias = None if gates is None else torch.nn.functional.logsigmoid(gates).cumsum(-1).neg()
    out = priorattn.attention(q, k, v, key_bias=key_bias, backend="sdpa")
    out.float().square().sum().backward()


def time_pair(L: int, dtype: torch.dtype, rounds: int, clock: Callable[[], float]) -> tuple[float, float]:
    cases = {"plain": inputs(L, dtype, False), "fox": inputs(L, dtype, True)}
    for args in cases.values():  # warm-up
        step(*args)
    samples = {name: [] for name in cases}
    for r in range(rounds):
        for name in list(cases)[r % 2 :] + list(cases)[: r % 2]:
            start = clock()
            step(*cases[name])
            samples[name].append(clock() - start)
    return statistics.median(samples["plain"]), statistics.median(samples["fox"])


def peak_mb(route: str, L: int, dtype: str) -> float:
    command = ["/usr/bin/time", "-v", sys.executable, __file__, "--one", route, str(L), dtype]
    err = subprocess.run(command, capture_output=True, text=True, check=True).stderr
    return int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", err).group(1)) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--one", nargs=3, metavar=("ROUTE", "L", "DTYPE"))
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.one:
        route, L, dtype = args.one
        step(*inputs(int(L), DTYPES[dtype], route == "fox"))
        return
    threads = torch.get_num_threads()
    clock = time.process_time if threads == 1 else time.perf_counter
    kind = "CPU" if threads == 1 else "wall"
    print(f"torch {torch.__version__}, {threads} threads, {kind} time, B={B} H={H} D={D}, causal")
    print("| L | dtype | plain SDPA s | FoX sdpa s | time ratio | plain MB | FoX MB | memory ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for L in args.lengths:
        for name in args.dtypes:
            plain, fox = time_pair(L, DTYPES[name], args.rounds, clock)
            mem_plain, mem_fox = peak_mb("plain", L, name), peak_mb("fox", L, name)
            print(
                f"| {L} | {name} | {plain:.3f} | {fox:.3f} | {fox / plain:.2f}x "
                f"| {mem_plain:.0f} | {mem_fox:.0f} | {mem_fox / mem_plain:.2f}x |",
                flush=True,
            )


if __name__ == "__main__":
    main()
