"""Packed rows and sliding windows: saved memory and time of the routes, this library against an
earlier checkout, side by side in one process.

A packed row (documents told apart by ``doc_ids``) and a sliding window (``window=``, local RoPE)
should cost what the keys a query can see cost, not ``L x L``. For a packed row the script counts
the tensors one forward of the ``sdpa`` route saves for the backward
(``torch.autograd.graph.saved_tensors_hooks``); for a window it times forward+backward of the
``sdpa`` and ``memeff`` routes. With ``--before SRC`` (the ``src`` directory of another checkout,
e.g. ``/work/main/src``) each measurement runs on both libraries, alternating, and prints the
ratio of medians.

    python benchmarks/spans.py --before /work/main/src            # B=1 H=4 D=64, L=8192, w=256
    /usr/bin/time -v python benchmarks/spans.py --one packed        # one packed fwd+bwd: peak RSS
    /usr/bin/time -v python benchmarks/spans.py --one packed --before /work/main/src
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType

import torch

import priorattn

#: Documents of the packed row, in tokens (they sum to 8192).
DOC_LENGTHS = (1500, 700, 2500, 300, 1200, 1992)
BATCH, HEADS, HEAD_WIDTH = 1, 4, 64


def library_src(src: str) -> str:
    """An argparse type for ``--before``: a directory holding a ``priorattn`` package."""
    if not (Path(src) / "priorattn" / "__init__.py").is_file():
        raise argparse.ArgumentTypeError(f"{src}: no priorattn package there (give a checkout's src)")
    return src


def load_library(src: str) -> ModuleType:
    """The ``priorattn`` package under ``src``, imported as ``priorattn_before``."""
    init = Path(src) / "priorattn" / "__init__.py"
    spec = importlib.util.spec_from_file_location("priorattn_before", init)
    module = importlib.util.module_from_spec(spec)
    sys.modules["priorattn_before"] = module
    spec.loader.exec_module(module)
    return module


def inputs(L: int, batch: int = BATCH) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(batch, HEADS, L, HEAD_WIDTH, generator=gen).requires_grad_() for _ in range(3)]


def packed_kwargs(lib: ModuleType) -> dict:
    """A packed row, causal, with GOAT (recency init: sink, spectral lanes and the ALiBi slope)."""
    lengths = torch.tensor(DOC_LENGTHS)
    doc_ids = torch.repeat_interleave(torch.arange(len(lengths)), lengths)[None]
    return dict(prior=lib.priors.GOAT(HEADS, 8, init="alibi"), doc_ids=doc_ids, backend="sdpa")


def saved_tensors(lib: ModuleType) -> tuple[int, int, int]:
    """Bytes of every tensor one packed forward saves for the backward, and the largest one's."""
    sizes = []

    def keep(t: torch.Tensor) -> torch.Tensor:
        sizes.append(t.numel() * t.element_size())
        return t

    q, k, v = inputs(sum(DOC_LENGTHS))
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        lib.attention(q, k, v, **packed_kwargs(lib))
    return sum(sizes), max(sizes), len(sizes)


def short_rows_doc_ids() -> torch.Tensor:
    """``(16, 256)`` document ids of training-sized windows: every third row crosses a boundary."""
    gen = torch.Generator().manual_seed(0)
    doc_ids = torch.arange(16)[:, None].repeat(1, 256) * 10
    for b in range(0, 16, 3):
        doc_ids[b, int(torch.randint(1, 256, (1,), generator=gen)) :] += 1
    return doc_ids


def fwd_bwd(lib: ModuleType, L: int, kwargs: dict, batch: int = BATCH) -> float:
    q, k, v = inputs(L, batch)
    start = time.perf_counter()
    lib.attention(q, k, v, **kwargs).sum().backward()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--before", type=library_src, help="src directory of the library to compare with")
    parser.add_argument("--length", type=int, default=8192, help="window runs (default 8192)")
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--one", choices=["packed"], help="one packed fwd+bwd only (for /usr/bin/time -v)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # two cores shared: one thread per process keeps medians comparable
    libs = {"after": priorattn} if args.before is None else {"before": load_library(args.before)}
    if args.one:
        lib = next(iter(libs.values()))
        fwd_bwd(lib, sum(DOC_LENGTHS), packed_kwargs(lib))
        return
    if args.before is not None:
        libs["after"] = priorattn
    print(f"torch {torch.__version__}, 1 thread, B={BATCH} H={HEADS} D={HEAD_WIDTH}, float32")
    print(f"\npacked row of {sum(DOC_LENGTHS)} tokens, documents {DOC_LENGTHS}, causal, GOAT via sdpa:")
    print("| library | saved MiB | largest saved MiB | saved tensors |\n|---|---:|---:|---:|")
    for name, lib in libs.items():
        total, largest, count = saved_tensors(lib)
        print(f"| {name} | {total / 2**20:.1f} | {largest / 2**20:.2f} | {count} |")
    print(f"\nwindow {args.window}, L={args.length}, causal, no prior, forward+backward:")
    print("| backend | library | median s | before / after |\n|---|---|---:|---:|")
    for backend in ("sdpa", "memeff"):
        # The after library without a window too: what local attention saves over full causal.
        cases = {name: (lib, dict(window=args.window, backend=backend)) for name, lib in libs.items()}
        cases["after, no window"] = (priorattn, dict(backend=backend))
        times = {name: [] for name in cases}
        for lib, kwargs in cases.values():  # warm-up
            fwd_bwd(lib, 1024, kwargs)
        for r in range(args.rounds):
            order = list(cases.items()) if r % 2 == 0 else list(cases.items())[::-1]
            for name, (lib, kwargs) in order:
                times[name].append(fwd_bwd(lib, args.length, kwargs))
        medians = {name: statistics.median(t) for name, t in times.items()}
        for name, m in medians.items():
            ratio = f"{medians['before'] / m:.1f}x" if name == "after" and "before" in medians else ""
            print(f"| {backend} | {name} | {m:.3f} | {ratio} |")

    print("\nshort packed rows: B=16, L=256, every third row crossing a document boundary, sdpa:")
    print("| prior | library | median ms | after / before |\n|---|---|---:|---:|")
    doc_ids = short_rows_doc_ids()
    for prior in ("none", "GOAT"):
        times = {name: [] for name in libs}
        for r in range(4 * args.rounds):
            for name, lib in list(libs.items()) if r % 2 == 0 else list(libs.items())[::-1]:
                kwargs = dict(doc_ids=doc_ids, backend="sdpa")
                kwargs["prior"] = None if prior == "none" else lib.priors.GOAT(HEADS, 8)
                times[name].append(fwd_bwd(lib, 256, kwargs, batch=16))
        medians = {name: statistics.median(t) for name, t in times.items()}
        for name, m in medians.items():
            ratio = f"{m / medians['before']:.2f}x" if name == "after" and "before" in medians else ""
            print(f"| {prior} | {name} | {1000 * m:.1f} | {ratio} |")


if __name__ == "__main__":
    main()
