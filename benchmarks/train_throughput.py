"""Training throughput of the tiny preset for each prior and encoding, as a ratio to NoPE.

Every configuration trains the ``tiny`` model (byte-level, seq_len 256, batch 16) with the real
training step (:func:`priorattn.train.loop.train_step`: forward, cross-entropy, backward, gradient
clipping, AdamW) on batches of the embedded Shakespeare corpus. The configurations are timed
round-robin in one process, the order rotating each round, and the median step time of each is
compared with NoPE's (``prior="uniform", encoding="none"``): ratio = NoPE time / its time, so 0.9
means 90% of NoPE's tokens per second.

    python benchmarks/train_throughput.py            # 7 rounds x 4 steps each, about 4 minutes
    python benchmarks/train_throughput.py --bf16     # the same under bfloat16 autocast
    python benchmarks/train_throughput.py --quick    # 3 rounds x 2 steps, a sanity run
    python benchmarks/train_throughput.py --before /work/main/src --configurations alibi goat --cpu-time
    python benchmarks/train_throughput.py --compile --configurations goat    # also trained compiled
    OMP_NUM_THREADS=1 python benchmarks/train_throughput.py --cpu-time --configurations t5 kerple fire fox

``--compile`` adds a row "(compiled)" per configuration: the same step through ``torch.compile``
(``TrainConfig.compile``, as ``priorattn train --compile`` runs it, deterministic kernels on the
CPU included); its warm-up step compiles (tens of seconds each on 2 cores), and its ratio is to
the compiled NoPE. The last lines give each configuration's compiled / eager tokens per second.

``--before SRC`` (the ``src`` directory of another checkout) times every configuration on that
library too, in the same round-robin, as rows marked "(before)" whose ratios are to its own NoPE;
``--configurations`` keeps only the named ones (NoPE always runs: it is the baseline).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from types import ModuleType

import torch
from spans import library_src, load_library
from torch.utils.benchmark import Timer
from tqdm import tqdm

import priorattn
from priorattn.data import Batches, prepare_data
from priorattn.models import preset

#: name -> GPTConfig overrides of the tiny preset. NoPE first: it is the baseline.
CONFIGURATIONS = {
    "nope": dict(prior="uniform", encoding="none"),
    "rope": dict(encoding="rope"),
    "sinusoidal": dict(encoding="sinusoidal"),
    "local_rope (window 64)": dict(encoding="local_rope", window=64),
    "alibi": dict(prior="alibi"),
    "ggd (BAM)": dict(prior="ggd"),
    "ggd + ssmax (BAM SSMax)": dict(prior="ggd", ssmax=True),
    "goat": dict(prior="goat"),
    "goat + ssmax": dict(prior="goat", ssmax=True),
    # the priors of issue 24, at their registry defaults, and FoX's forget gate (no encoding)
    "t5": dict(prior="t5"),
    "kerple": dict(prior="kerple"),
    "fire": dict(prior="fire"),
    "sandwich": dict(prior="sandwich"),
    "fox": dict(attention="fox"),
}
#: What marks the rows of the library given by ``--before``, and the compiled rows of ``--compile``.
BEFORE, COMPILED = " (before)", " (compiled)"
#: Least tokens/s as a fraction of NoPE's, per dtype (issue 13 for bf16 autocast).
TARGETS = {
    "fp32": {"goat": 0.9},
    "bf16 autocast": {"goat": 0.95, "alibi": 0.95, "ggd (BAM)": 0.85},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=4, help="training steps per timed sample")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--quick", action="store_true", help="3 rounds of 2 steps")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--cpu-time", action="store_true", help="time by process CPU time (one thread, a loaded machine)"
    )
    parser.add_argument(
        "--before", type=library_src, help="src directory of a library to time side by side with this one"
    )
    parser.add_argument(
        "--configurations", nargs="+", choices=list(CONFIGURATIONS), help="only these (and NoPE)"
    )
    parser.add_argument("--compile", action="store_true", help="also time each trained through torch.compile")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.steps = 3, 2

    seq_len = preset("tiny").seq_len
    with tempfile.TemporaryDirectory() as run_dir:
        data = prepare_data(None, tokenizer="byte", seq_len=seq_len, run_dir=Path(run_dir))
    batches = Batches(data.train, args.batch_size, seed=0)
    chosen = {"nope", *(args.configurations or CONFIGURATIONS)}
    libraries = {"": priorattn} if args.before is None else {"": priorattn, BEFORE: load_library(args.before)}
    steps = {
        name + label: training_step(lib, overrides, args, batches)
        for label, lib in libraries.items()
        for name, overrides in CONFIGURATIONS.items()
        if name in chosen
    }
    if args.compile:
        compiled = [(name, overrides) for name, overrides in CONFIGURATIONS.items() if name in chosen]
        steps |= {name + COMPILED: training_step(priorattn, o, args, batches, True) for name, o in compiled}
    report(round_robin(steps, args.rounds, args.steps, args.cpu_time), args, seq_len)


def round_robin(steps: dict, rounds: int, repeats: int, cpu_time: bool = False) -> dict[str, list[float]]:
    """Seconds per call of each ``steps[name]()``: after one warm-up call each, ``rounds`` samples
    of ``repeats`` calls, the configurations taken in turn with the order rotating each round.
    ``cpu_time``: the process's CPU seconds rather than wall-clock ones (on one thread, what the
    step costs whatever else the machine runs)."""
    for step in steps.values():  # warm up: first-call allocations, lazy kernels
        step()
    samples = {name: [] for name in steps}
    names = list(steps)
    for r in tqdm(range(rounds), desc="rounds"):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            if cpu_time:
                start = time.process_time()
                for _ in range(repeats):
                    steps[name]()
                samples[name].append((time.process_time() - start) / repeats)
                continue
            timer = Timer("step()", globals={"step": steps[name]}, num_threads=torch.get_num_threads())
            samples[name].append(timer.timeit(repeats).mean)
    return samples


def training_step(lib: ModuleType, overrides: dict, args, batches: Batches, compiled: bool = False):
    """A closure running one optimizer step of a fresh tiny model of library ``lib`` on the next
    batch; ``compiled``: through ``torch.compile``, as ``TrainConfig.compile`` trains."""
    models, train, optim, distributed, loop = (
        importlib.import_module(f"{lib.__name__}.{part}")
        for part in ("models", "train", "train.optim", "train.distributed", "train.loop")
    )
    torch.manual_seed(0)
    config = train.TrainConfig(
        batch_size=args.batch_size, bf16=args.bf16, **({"compile": True} if compiled else {})
    )
    model = models.GPT(models.preset("tiny", **overrides))
    optimizer = optim.build_optimizer(model, config)
    process, counter = distributed.Process(), iter(range(10**9))
    kernels = loop.reproducible_kernels if compiled else lambda config, process: contextlib.nullcontext()

    def step():
        with kernels(config, process):
            loop.train_step(model, [batches.batch(next(counter))], optimizer, config, process)

    return step


def baseline(name: str) -> str:
    """The NoPE row a row's ratio is to: its own library's, compiled for a compiled row."""
    return "nope" + next((mark for mark in (BEFORE, COMPILED) if name.endswith(mark)), "")


def report(samples: dict[str, list[float]], args, seq_len: int) -> None:
    tokens = args.batch_size * seq_len
    medians = {name: statistics.median(times) for name, times in samples.items()}
    ratios = {name: medians[baseline(name)] / m for name, m in medians.items()}
    dtype = "bf16 autocast" if args.bf16 else "fp32"
    clock = "process CPU time" if args.cpu_time else "wall-clock"
    print(
        f"\ntiny preset, batch {args.batch_size} x {seq_len} tokens, {dtype}, {torch.get_num_threads()} "
        f"threads, median of {args.rounds} samples x {args.steps} steps, {clock}\n"
    )
    print("| configuration | ms / step | tokens / s | ratio to NoPE |")
    print("|---|---:|---:|---:|")
    for name, median in medians.items():
        print(f"| {name} | {1e3 * median:.0f} | {tokens / median:,.0f} | {ratios[name]:.2f} |")
    print()
    for name in medians:
        if name.endswith(COMPILED):
            eager = name.removesuffix(COMPILED)
            print(f"{eager}: compiled / eager tokens/s {medians[eager] / medians[name]:.2f}")
    for name, target in TARGETS[dtype].items():
        if name not in ratios:
            continue
        ratio = ratios[name]
        verdict = "met" if ratio >= target else "MISSED"
        print(f"target: {name} >= {target:.2f}x NoPE tokens/s: {ratio:.2f}x, {verdict}")
    if args.json:
        args.json.write_text(
            json.dumps(
                dict(
                    date=datetime.datetime.now().isoformat(timespec="seconds"),
                    machine=platform.processor() or platform.machine(),
                    threads=torch.get_num_threads(),
                    dtype=dtype,
                    clock=clock,
                    batch_size=args.batch_size,
                    seq_len=seq_len,
                    median_step_s=medians,
                    ratio_to_nope=ratios,
                ),
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
