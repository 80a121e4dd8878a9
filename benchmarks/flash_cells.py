"""Cost per (query, key) cell of the CPU flash kernel, for the shapes of the `sdpa` route's calls.

With a slope the route cuts the queries into runs (1024 for ALiBi's steepest slope in float32),
each one unmasked call over its older keys (in blocks of ``KEY_BLOCK``) and one causal square over
its newest: this prints what those calls cost per cell, forward and backward, against one causal
call over all of L, and what float32 subnormal weights (logits 95 below a row's largest, as a slope
gives distant keys) cost the backward with and without flushing them (in the routes' own scope,
``functional/subnormals.py``, which flushes on every OpenMP worker too). Calls of fewer heads are
costed per cell of all of them: on two threads one head's backward runs on one thread; a causal
call of head width 65 (ALiBi's fold of 64 lanes) is costed too.

    OMP_NUM_THREADS=1 python benchmarks/flash_cells.py [--length 16384] [--run 1024] [--threads 2]
"""

from __future__ import annotations

import argparse
import time
from contextlib import nullcontext

import torch

from priorattn.functional.subnormals import flushing_subnormals

FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
FLASH_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
HEADS = 4
CPU = torch.device("cpu")


def seconds(
    lq: int, lk: int, causal: bool, distant: float | None = None, heads: int = HEADS, width: int = 64
) -> tuple[float, float]:
    """Forward and backward seconds of one call; ``distant``: the logit offset of all but 8 keys."""
    q = torch.randn(1, heads, lq, width) / 8
    k, v = torch.randn(1, heads, lk, width), torch.randn(1, heads, lk, width)
    if distant is not None:  # a lane that puts all but the newest 8 keys `distant` below
        q[..., -1], k[..., -1] = 1.0, torch.where(torch.arange(lk) < lk - 8, distant, 0.0)
    start = time.perf_counter()
    out, lse = FLASH(q, k, v, 0.0, causal, scale=1.0)
    middle = time.perf_counter()
    FLASH_BACKWARD(torch.randn_like(out), q, k, v, out, lse, 0.0, causal, scale=1.0)
    return middle - start, time.perf_counter() - middle


def per_cell(label: str, lq: int, lk: int, causal: bool, heads: int = HEADS, width: int = 64) -> None:
    """Nanoseconds per cell of one head: a call of fewer heads than threads leaves threads idle in
    the backward, which gives each (batch row, head) to one thread."""
    forward, backward = seconds(lq, lk, causal, heads=heads, width=width)
    cells = heads * lq * lk / (2 if causal else 1) / HEADS
    print(f"| {label} | {forward / cells * 1e9:.1f} | {backward / cells * 1e9:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--run", type=int, default=1024)
    parser.add_argument("--key-block", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"{torch.get_num_threads()} threads, head width 64, {HEADS} heads")
    seconds(256, 256, True)  # warm-up
    print(f"| call | forward ns / cell of {HEADS} heads | backward ns / cell |\n|---|---:|---:|")
    with flushing_subnormals(CPU):
        per_cell(f"causal {args.length}", args.length, args.length, True)
        per_cell(f"unmasked {args.run} x {args.key_block}", args.run, args.key_block, False)
        per_cell(f"causal square {args.run}", args.run, args.run, True)
        # ALiBi's fold is one lane wider than a head of 64 (its slope lane), GOAT's is not
        per_cell(f"causal {args.length}, head width 65", args.length, args.length, True, width=65)
        for heads in (1, 2, 3):
            per_cell(
                f"unmasked {args.run} x {args.key_block}, {heads} of {HEADS} heads",
                args.run,
                args.key_block,
                False,
                heads,
            )
    for flush in (False, True):
        with flushing_subnormals(CPU) if flush else nullcontext():
            backward = seconds(args.run, 2 * args.run, False, distant=-95.0)[1]
        print(f"subnormal weights, flushed={flush}: backward {backward:.3f} s ({args.run} x {2 * args.run})")


if __name__ == "__main__":
    main()
