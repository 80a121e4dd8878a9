"""GGD via ``memeff`` against plain causal SDPA, this checkout's library and another's side by side.

Wall-clock ratios from separate runs move by tens of percent on the shared machine; this script
loads a second copy of ``priorattn`` (``--before``: the ``src`` directory of another checkout,
imported as the package ``priorattn_before``) next to this one, and times one forward+backward of
each (and of plain SDPA) round-robin in one process, the order rotating each round, by process CPU
time (run it on one thread: ``OMP_NUM_THREADS=1``). Ratios are medians over plain SDPA's median.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/memeff_before_after.py --before ../main/src
    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/memeff_before_after.py --before ../main/src \\
        --shape 16 4 256 32 --dtype bf16 --init uniform --repeats 5     # the tiny model's attention
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from types import ModuleType

import torch
from spans import library_src, load_library  # this script's directory is on sys.path

import priorattn

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def runs(args: argparse.Namespace, before: ModuleType) -> dict[str, Callable[[], None]]:
    """One forward+backward each of plain causal SDPA and GGD via ``memeff`` from both libraries,
    on the same inputs and output gradient."""
    torch.manual_seed(0)
    B, H, L, D = args.shape
    dtype = DTYPES[args.dtype]
    q, k, v = (torch.randn(B, H, L, D, dtype=dtype, requires_grad=True) for _ in range(3))
    grad_out = torch.randn(B, H, L, D, dtype=dtype)

    def ggd(library: ModuleType) -> Callable[[], None]:
        prior = library.priors.GGD(H, init=args.init)
        return lambda: library.attention(q, k, v, prior=prior, causal=True, backend="memeff").backward(
            grad_out
        )

    def sdpa() -> None:
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad_out)

    return {"sdpa": sdpa, "before": ggd(before), "after": ggd(priorattn)}


def round_robin(steps: dict[str, Callable[[], None]], rounds: int, repeats: int) -> dict[str, float]:
    """Median CPU seconds per call of each step; one warm-up call each first."""
    for step in steps.values():
        step()
    names, samples = list(steps), {name: [] for name in steps}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.process_time()
            for _ in range(repeats):
                steps[name]()
            samples[name].append((time.process_time() - start) / repeats)
    return {name: statistics.median(times) for name, times in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=library_src, required=True, help="another checkout's src directory")
    parser.add_argument("--shape", type=int, nargs=4, default=[1, 4, 4096, 64], metavar=("B", "H", "L", "D"))
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    parser.add_argument("--init", choices=["alibi", "uniform"], default="alibi", help="GGD's init")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=1, help="calls per timed sample")
    args = parser.parse_args()
    medians = round_robin(runs(args, load_library(args.before)), args.rounds, args.repeats)
    base = medians["sdpa"]
    print(
        f"B, H, L, D = {tuple(args.shape)}, {args.dtype}, GGD init={args.init!r}, causal, fwd+bwd, "
        f"{torch.get_num_threads()} threads, process CPU time, median of {args.rounds} rounds"
    )
    print("| route | ms | time x SDPA |\n|---|---:|---:|")
    for name, seconds in medians.items():
        print(f"| {name} | {1e3 * seconds:.1f} | {seconds / base:.3f} |")
    print(f"after / before: {medians['after'] / medians['before']:.3f}")


if __name__ == "__main__":
    main()
