"""The `sdpa` route's call plans under a slope, side by side against plain causal SDPA.

ALiBi and GOAT (`init="alibi"`) fold their slope into a lane re-centred on every run of queries
(`functional/sdpa/`). How those runs are planned, three ways, each timed in one process against
plain SDPA (the `attention.py` op rows: B=1, H=4, head width 64 in all, causal, float32, fwd+bwd):

- `alone`: each head takes the runs its own slope allows (the fourth session's plan);
- `chunks`: heads in chunks that keep every thread of the kernel's backward busy
  (`heads_per_thread_team`: pairs on two threads, one head on one);
- `bands`: chunks, and steep heads leave out the keys they give no weight (`weight_bands`): the
  route's plan.

Samples are taken round-robin, the order rotating each round; the table has the medians. On one
thread a sample is the process's CPU time (steadier on a shared machine), else wall time. `cells`
is the share of a causal call's (query, key) cells the plan computes.

    OMP_NUM_THREADS=1 python benchmarks/slope_plans.py --threads 1 [--lengths 4096 16384] [--rounds 5]
    python benchmarks/slope_plans.py --threads 2 --lengths 4096
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from attention import PLAIN, Case, build_op, make_prior, qk_width  # this script's directory is on sys.path

import priorattn
from priorattn.functional.sdpa import planning, route

PLANS = {
    "alone": (lambda batch, threads: 1, lambda *args: None),
    "chunks": (planning.heads_per_thread_team, lambda *args: None),
    "bands": (planning.heads_per_thread_team, planning.weight_bands),
}


def planned(plan: str, run: Callable[[], None]) -> Callable[[], None]:
    """``run`` under one of :data:`PLANS`."""
    team, bands = PLANS[plan]

    def planned_run() -> None:
        saved = route.heads_per_thread_team, route.weight_bands
        route.heads_per_thread_team, route.weight_bands = team, bands
        try:
            run()
        finally:
            route.heads_per_thread_team, route.weight_bands = saved

    return planned_run


def cell_share(prior_name: str, L: int, plan: str) -> float:
    """Cells of the route's calls over those of one causal call per head, for random inputs."""
    prior, shares = make_prior(prior_name), []
    q, k, v = (torch.randn(1, 4, L, width) for width in (qk_width(prior), qk_width(prior), 64))
    head_plans = route.head_plans

    def spy(*args) -> planning.Plans:
        plans = head_plans(*args)
        shares.extend(planning.cells(calls) * (h.stop - h.start) for h, calls in plans)
        return plans

    route.head_plans = spy
    try:
        with torch.no_grad():
            planned(plan, lambda: priorattn.attention(q, k, v, prior=prior, causal=True, backend="sdpa"))()
    finally:
        route.head_plans = head_plans
    return sum(shares) / (4 * L * (L + 1) / 2)


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=positive_int, nargs="+", default=[4096, 16384])
    parser.add_argument("--priors", nargs="+", default=["GOAT", "ALiBi"], choices=["GOAT", "ALiBi"])
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--rounds", type=positive_int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.process_time if args.threads == 1 else time.perf_counter
    print(f"{args.threads} thread(s), {'CPU' if args.threads == 1 else 'wall'} time, {args.rounds} rounds")
    print("| prior | L | plan | cells | time x SDPA |\n|---|---:|---|---:|---:|")
    for L in args.lengths:
        torch.manual_seed(0)
        runs = {"plain": build_op(PLAIN, L, torch.float32)}
        for name in args.priors:
            for plan in PLANS:
                runs[f"{name} {plan}"] = planned(plan, build_op(Case(name, "sdpa"), L, torch.float32))
        samples = {key: [] for key in runs}
        names = list(runs)
        for r in range(args.rounds + 1):  # the first round warms up
            for key in names[r % len(names) :] + names[: r % len(names)]:
                start = clock()
                runs[key]()
                if r:
                    samples[key].append(clock() - start)
        base = statistics.median(samples["plain"])
        for key in names[1:]:
            name, plan = key.split()
            ratio = statistics.median(samples[key]) / base
            print(f"| {name} | {L} | {plan} | {cell_share(name, L, plan):.2f} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
