"""priorattn's GOAT layer against its authors' ``goat-attention`` 0.1.1 layer and a plain SDPA layer.

Issue 28's speed target: a GOAT layer with the package's options within 1.0x the package's own
``GoatAttention`` and within 1.05x a plain SDPA layer, forward+backward at L = 2048, d_model = 256,
side by side in one process. The layers (4 heads of 64 lanes, causal self-attention, float32):

- ``goat-attention``: ``GoatAttention(256, 4, pos_rank=8, abs_rank=8, enable_key_bias=True,
  training_seq_len=L, batch_first=True, bias=False)`` (the package's ranks; its sink with the recency
  slope in the sink's lane), with ``prior_init`` and ``prior_gate`` as the case says, called with
  ``need_weights=False, is_causal=True``;
- ``priorattn GOAT (same function)``: ``PriorMultiheadAttention`` with ``GOAT(4, 8, sink="shared",
  slope="learned", gate=..., sink_freqs=8, sink_hidden=4)`` holding the package layer's parameters,
  copied as ``tests/priors/test_goat_attention.py`` copies them: the slope has a lane of its own, so
  the head is one lane wider (65: a zero value lane) and computes the same outputs (checked to 1e-4
  before timing);
- ``priorattn GOAT (head 64)``: the same prior in a 64-lane head (46 content lanes, one fewer than
  the package's 47; the first 46 copied), the layer ``GOAT`` builds at this width;
- ``plain SDPA``: ``PriorMultiheadAttention`` without a prior (one causal SDPA call), and
  ``plain SDPA (head 65)``, the same with 65-lane heads: what the same-function layer's extra lane
  costs by itself.

Cases: ``uniform`` (the package's ``prior_init="uniform"``, priorattn's ``init="uniform"``: a flat
slope of 1e-13), ``seeded`` (the package's default and priorattn's: the ALiBi slopes; the package also
draws its spectral weights from N(0, 1e-2)), each without and with the query-norm gate. Timing:
``torch.utils.benchmark.Timer`` runs ``--number`` steps per sample; each round times every layer
once, the order rotating each round; medians over
``--rounds`` rounds, and each layer's ratio to the package's and to plain SDPA. The clock is the
process's CPU time (``time.process_time``; one thread by default), not the wall clock: on a machine
shared with other jobs the wall clock counts the time others hold the core.

    PYTHONPATH=src python benchmarks/goat_package.py                   # L 2048, 1 thread
    PYTHONPATH=src python benchmarks/goat_package.py --cases uniform --profile   # where the time goes
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import statistics
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from types import ModuleType

import torch
from goat import GoatAttention
from torch import Tensor
from torch.utils import benchmark

from priorattn import PriorMultiheadAttention

E, H, R, M = 256, 4, 8, 8  # width, heads, relative and sink frequencies (the package's ranks)
HD = E // H
CASES = {  # name -> (prior_init, prior_gate) of the package's layer
    "uniform": ("uniform", "none"),
    "uniform+gate": ("uniform", "query_norm"),
    "seeded": ("seeded", "none"),
    "seeded+gate": ("seeded", "query_norm"),
}


def their_layer(init: str, gate: str, L: int) -> GoatAttention:
    torch.manual_seed(0)
    return GoatAttention(
        E,
        H,
        bias=False,
        batch_first=True,
        pos_rank=R,
        abs_rank=M,
        enable_key_bias=True,
        training_seq_len=L,
        prior_init=init,
        prior_gate=gate,
    )


def our_layer(theirs: GoatAttention, gated: bool, head_dim: int) -> PriorMultiheadAttention:
    """priorattn's GOAT layer holding ``theirs``' parameters, copied by the equivalence test's own
    function (``tests/priors/test_goat_attention.py: our_layer``), so the two cannot drift apart."""
    return equivalence_test().our_layer(theirs, "shared", "learned", gated, head_dim)


@functools.cache
def equivalence_test() -> ModuleType:
    path = Path(__file__).resolve().parent.parent / "tests" / "priors" / "test_goat_attention.py"
    spec = importlib.util.spec_from_file_location("test_goat_attention", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def layers(case: str, L: int) -> dict[str, Callable[[Tensor], Tensor]]:
    """The layers of ``case``, each as ``x -> y``; checks that the same-function layer is."""
    init, gate = CASES[case]
    theirs = their_layer(init, gate, L)
    same = our_layer(theirs, gate != "none", HD + 1)
    narrow = our_layer(theirs, gate != "none", HD)
    torch.manual_seed(1)
    plain = PriorMultiheadAttention(E, H, backend="sdpa")
    plain_wide = PriorMultiheadAttention(E, H, head_dim=HD + 1, backend="sdpa")
    x = torch.randn(1, L, E)
    with torch.no_grad():
        expected = theirs(x, x, x, need_weights=False, is_causal=True)[0]
        torch.testing.assert_close(same(x)[0], expected, rtol=1e-4, atol=1e-4)
    return {
        "goat-attention": lambda x: theirs(x, x, x, need_weights=False, is_causal=True)[0],
        "priorattn GOAT (same function)": lambda x: same(x)[0],
        "priorattn GOAT (head 64)": lambda x: narrow(x)[0],
        "plain SDPA": lambda x: plain(x)[0],
        "plain SDPA (head 65)": lambda x: plain_wide(x)[0],
    }


def stepper(forward: Callable[[Tensor], Tensor], L: int, batch: int) -> Callable[[], None]:
    """One forward and backward pass of ``forward`` on fixed inputs (gradients reach the input)."""
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(batch, L, E, generator=gen).requires_grad_()
    grad = torch.randn(batch, L, E, generator=gen)

    def step() -> None:
        x.grad = None
        forward(x).backward(grad)

    return step


def time_case(case: str, L: int, batch: int, rounds: int, number: int) -> dict[str, float]:
    """Median seconds of one forward+backward per layer, the layers alternating round by round."""
    steps = {name: stepper(forward, L, batch) for name, forward in layers(case, L).items()}
    timers = {
        name: benchmark.Timer("step()", globals=dict(step=step), timer=time.process_time)
        for name, step in steps.items()
    }
    for step in steps.values():  # warm-up
        step()
    samples: dict[str, list[float]] = {name: [] for name in steps}
    names = list(steps)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            samples[name].append(timers[name].timeit(number).median)
    return {name: statistics.median(times) for name, times in samples.items()}


def profile(case: str, L: int, batch: int) -> None:
    """The operators that take the time of each layer but the same-function one, over 5 steps."""
    for name, forward in layers(case, L).items():
        if name in ("priorattn GOAT (same function)", "plain SDPA (head 65)"):
            continue
        step = stepper(forward, L, batch)
        step()
        with torch.profiler.profile() as prof:
            for _ in range(5):
                step()
        print(f"\n{name}, {case}: 5 steps")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--number", type=int, default=3, help="steps per timed sample")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--profile", action="store_true", help="print the operators' times instead")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.profile:
        for case in args.cases:
            profile(case, args.length, args.batch)
        return
    print(
        f"torch {torch.__version__}, goat-attention {version('goat-attention')}, {args.threads} thread(s); "
        f"B={args.batch} L={args.length} d_model={E} H={H} R={R} M={M}, causal, float32, fwd+bwd; "
        f"medians of {args.rounds} rounds of {args.number} steps"
    )
    print("| case | layer | fwd+bwd CPU ms | x goat-attention | x plain SDPA |")
    print("|---|---|---:|---:|---:|")
    for case in args.cases:
        times = time_case(case, args.length, args.batch, args.rounds, args.number)
        for name, seconds in times.items():
            print(
                f"| {case} | {name} | {1e3 * seconds:.1f} | {seconds / times['goat-attention']:.3f} "
                f"| {seconds / times['plain SDPA']:.3f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
