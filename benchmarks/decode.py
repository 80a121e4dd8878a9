"""KV-cache decoding: the cache written in place (``KVCache.extend`` now) against ``torch.cat`` per step.

Before issue 8, ``KVCache.extend`` concatenated the whole cache with each decode step's entries, so a
generation of ``L`` tokens copied ``O(L^2)`` entries. Now entries go in place into buffers that grow
1.5x when full. Both strategies run side by side in one process, alternating (the order rotates
each round); ``concat`` is the earlier ``extend``, swapped in for its rounds.

1. The cache alone: a generation of ``N`` tokens, one key/value per step, into one layer's cache
   (B=1, Hkv=4, head width 64, float32). Time of ``extend`` per token (mean over the generation,
   median over rounds) and bytes copied per token (entries written into the cache's buffers,
   moves to larger buffers included).
2. A model decoding at a long context: the ``small`` preset with the GOAT prior (6 layers, 6 heads
   of 64) prefilled with ``P`` tokens once, then ``S`` decode steps per round. Median time per
   step over all rounds, and mean bytes copied per step over all layers (in place, the first step
   moves the exact-size prefilled cache to buffers with room: a real generation does that once
   per ``P / 2`` steps, not once per ``S``).

3. Decoding with every prior (``--priors``): one model per prior of a preset (``tiny`` by default;
   NoPE, ALiBi, GGD as BAM, GOAT, both started at ALiBi, RoPE, sinusoidal embeddings, and RoPE
   with a sliding window of 256 keys), each prefilled with ``P`` tokens once, then ``S``
   single-token steps per round through ``GPT.forward`` with the KV caches, as ``GPT.generate``
   does; the priors take turns (the order rotates each round) and each goes on
   from its own caches, so the caches grow by ``S`` per round as in a generation. Tokens/s from the
   median step time over all rounds, and its ratio to NoPE's (issue 13's target: >= 0.9x). By
   default one step per prior per round and 100 rounds: turns of a fraction of a second, so a
   change in the machine's load falls on every prior alike (with 16 steps in 5 rounds, runs on a
   shared machine put RoPE, whose step is NoPE's plus the rotation of one token, anywhere in
   0.88x-1.15x NoPE's).
   The steps are timed in CPU time of the thread (``time.thread_time``; run with one thread): on a
   shared machine wall time also counts the time other jobs hold the core.

    python benchmarks/decode.py            # N = 2048 4096 8192, P = 4096 16384, 3 rounds, ~6 minutes
    python benchmarks/decode.py --quick    # N = 512 1024, P = 1024, 2 rounds
    python benchmarks/decode.py --priors --json                  # P = 1k 4k 16k 32k, tiny
    python benchmarks/decode.py --priors --preset small --lengths 1024 4096

4. Prefill with every prior (``--prefill``): one forward pass of a ``P``-token prompt (32k by
   default) through each row of :data:`DECODERS`, for the ``tiny`` and ``small`` presets, no
   gradients, as ``GPT.generate`` starts. Each pass runs in a fresh subprocess (``--one PRESET ROW
   P``) that builds the model, warms up on a 1024-token prompt, then times the prefill and reports
   its peak RSS (``VmHWM``). The time is the subprocess's CPU time (``time.process_time``): with
   one torch thread every kernel runs on the calling thread (``subnormals.py`` flushes subnormals
   on the caller and its OpenMP workers in a scope, no thread of its own), so it equals the
   thread's CPU time, and it would still count a thread some library started; with more threads
   it adds up every thread's CPU time, not the wall time. The subprocesses run with a fixed
   ``MALLOC_MMAP_THRESHOLD_`` (:data:`MMAP_THRESHOLD`): glibc otherwise raises its threshold as
   large blocks are freed and keeps later ones on its heap, and the same pass of the same code
   peaked anywhere from 610 to 760 MB; with the threshold fixed every large block goes back when
   freed, and the peak repeats to within 0.1 MB. The rows take turns, the order rotating each
   round (one by default). A baseline subprocess builds the NoPE model and warms up only, so
   memory is given whole and above it.
   Ratios are to NoPE's (issue 13's targets: time <= 1.3x, memory <= 1.2x).

    python benchmarks/decode.py --prefill --json                 # P = 32768, tiny and small, 1 round
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time

import torch
from attention import peak_rss_mb  # this script's directory is on sys.path

from priorattn import KVCache
from priorattn.models import GPT, preset


def concat_extend(self: KVCache, new: KVCache) -> KVCache:
    """``KVCache.extend`` before issue 8 (no documents or padding here): a new cache of copies."""
    return KVCache(
        torch.cat([self.k, new.k], dim=2),
        torch.cat([self.v, new.v], dim=2),
        torch.cat([self.positions, new.positions], dim=-1),
    )


@contextlib.contextmanager
def strategy(name: str):
    if name == "in place":
        yield
        return
    in_place = KVCache.extend
    KVCache.extend = concat_extend
    try:
        yield
    finally:
        KVCache.extend = in_place


def copied_bytes(before: KVCache, after: KVCache) -> int:
    """Bytes of keys and values written to make ``after`` from ``before``: the new entries, or all
    of them when ``after`` lives in other buffers than ``before``."""
    moved = after.k.untyped_storage().data_ptr() != before.k.untyped_storage().data_ptr()
    entries = len(after) if moved else len(after) - len(before)
    per_entry = (after.k[:, :, :1].numel() + after.v[:, :, :1].numel()) * after.k.element_size()
    return entries * per_entry


STRATEGIES = ("concat", "in place")


def cache_alone(N: int, rounds: int) -> dict[str, tuple[float, float]]:
    """``{strategy: (seconds per token, bytes copied per token)}`` over a generation of ``N`` tokens."""
    B, Hkv, D = 1, 4, 64
    step_k = torch.randn(B, Hkv, 1, D)
    times, copied = {name: [] for name in STRATEGIES}, {}
    for r in range(rounds):
        order = STRATEGIES if r % 2 == 0 else STRATEGIES[::-1]
        for name in order:
            with strategy(name), torch.no_grad():
                cache = KVCache(step_k, step_k, torch.zeros(1, 1, dtype=torch.long))
                seconds, total = 0.0, 0
                for t in range(1, N):
                    new = KVCache(step_k, step_k, torch.full((1, 1), t))
                    start = time.perf_counter()
                    extended = cache.extend(new)
                    seconds += time.perf_counter() - start
                    total += copied_bytes(cache, extended)
                    cache = extended
                times[name].append(seconds / (N - 1))
            copied[name] = total / (N - 1)
    return {name: (statistics.median(times[name]), copied[name]) for name in STRATEGIES}


@torch.no_grad()
def model_decode(P: int, steps: int, rounds: int) -> dict[str, tuple[float, float]]:
    """``{strategy: (median seconds per decode step, bytes copied per step)}`` after a ``P``-token prefill."""
    torch.manual_seed(0)
    model = GPT(preset("small", prior="goat")).eval()
    prompt = torch.randint(256, (1, P))
    _, _, prefilled = model(prompt)  # exact-size caches, read but never written by either strategy
    next_tokens = torch.randint(256, (1, steps))
    times, copied = {name: [] for name in STRATEGIES}, {name: [] for name in STRATEGIES}
    for r in range(rounds):
        order = STRATEGIES if r % 2 == 0 else STRATEGIES[::-1]
        for name in order:
            with strategy(name):
                caches = prefilled
                for t in range(steps):
                    start = time.perf_counter()
                    _, _, extended = model(next_tokens[:, t : t + 1], caches=caches)
                    times[name].append(time.perf_counter() - start)
                    copied[name].append(sum(copied_bytes(a, b) for a, b in zip(caches, extended)))
                    caches = extended
    return {name: (statistics.median(times[name]), statistics.mean(copied[name])) for name in STRATEGIES}


#: The models of section 3: ``preset`` overrides per row. BAM's GGD and GOAT start at ALiBi, so
#: every prior's terms are non-zero (a uniform start would still compute them).
DECODERS = {
    "nope": dict(prior="uniform"),
    "alibi": dict(prior="alibi"),
    "ggd": dict(prior="ggd", prior_init="alibi"),
    "goat": dict(prior="goat", prior_init="alibi"),
    "rope": dict(prior="uniform", encoding="rope"),
    "sinusoidal": dict(prior="uniform", encoding="sinusoidal"),
    "local_rope": dict(prior="uniform", encoding="local_rope", window=256),
}


@torch.no_grad()
def prior_decode(name: str, P: int, steps: int, rounds: int) -> dict[str, float]:
    """``{row: median seconds per decode step}`` of each row of :data:`DECODERS`, ``P`` tokens cached."""
    models, caches, times = {}, {}, {}
    prompt = torch.randint(256, (1, P), generator=torch.Generator().manual_seed(0))
    for row, overrides in DECODERS.items():
        torch.manual_seed(0)
        models[row] = GPT(preset(name, **overrides)).eval()
        _, _, caches[row] = models[row](prompt)
        _, _, caches[row] = models[row](prompt[:, -1:], caches=caches[row])  # moves to buffers with room
        times[row] = []
    token = prompt[:, -1:]
    rows = list(DECODERS)
    for r in range(rounds):
        for row in rows[r % len(rows) :] + rows[: r % len(rows)]:
            for _ in range(steps):
                start = time.thread_time()
                _, _, caches[row] = models[row](token, caches=caches[row])
                times[row].append(time.thread_time() - start)
    return {row: statistics.median(times[row]) for row in rows}


def print_prior_decode(name: str, lengths: list[int], steps: int, rounds: int, as_json: bool) -> None:
    rows = list(DECODERS)
    print(f"\n3. The {name} preset, {steps} decode steps per prior per round, {rounds} rounds, tokens/s:\n")
    print("| P | " + " | ".join(rows) + " | " + " | ".join(f"{r} / nope" for r in rows[1:]) + " |")
    print("|---:|" + "---:|" * (2 * len(rows) - 1))
    results = []
    for P in lengths:
        seconds = prior_decode(name, P, steps, rounds)
        speed = {row: 1.0 / seconds[row] for row in rows}
        ratio = {row: speed[row] / speed["nope"] for row in rows[1:]}
        cells = [f"{speed[row]:.0f}" for row in rows] + [f"{ratio[row]:.2f}x" for row in rows[1:]]
        print(f"| {P} | " + " | ".join(cells) + " |", flush=True)
        results.append(dict(cache=P, tokens_per_s=speed, vs_nope=ratio))
    if as_json:
        print(json.dumps(dict(preset=name, steps=steps, rounds=rounds, results=results)))


#: Prompt length of the prefill subprocesses' warm-up (loads the kernels every route uses).
PREFILL_WARM_UP = 1024
#: Bytes from which glibc's malloc maps a block of its own, returned to the system when freed.
MMAP_THRESHOLD = 1 << 17


@torch.no_grad()
def prefill_one(name: str, row: str, P: int) -> None:
    """Child process: one ``P``-token prefill of ``row`` after a short warm-up; prints seconds and
    peak RSS as JSON. Row ``baseline`` is the NoPE model and its warm-up alone."""
    torch.manual_seed(0)
    model = GPT(preset(name, **DECODERS["nope" if row == "baseline" else row])).eval()
    prompt = torch.randint(256, (1, P), generator=torch.Generator().manual_seed(0))
    model(prompt[:, :PREFILL_WARM_UP])
    seconds = 0.0
    if row != "baseline":
        start = time.process_time()
        model(prompt)
        seconds = time.process_time() - start
    print(json.dumps(dict(seconds=seconds, peak_mb=peak_rss_mb())))


def run_prefill(name: str, row: str, P: int) -> dict[str, float]:
    threads = str(torch.get_num_threads())
    cmd = [sys.executable, __file__, "--one", name, row, str(P), "--threads", threads]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)}
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def print_prefill(names: list[str], P: int, rounds: int, as_json: bool) -> None:
    rows = list(DECODERS)
    print(f"\n4. Prefill of a {P}-token prompt, one fresh subprocess per pass, {rounds} rounds:\n")
    print(
        "| preset | prior | seconds | time / nope | peak MB | above base MB | memory / nope | above / nope |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    results = []
    for name in names:
        baseline = run_prefill(name, "baseline", P)["peak_mb"]
        seconds, peak = {row: [] for row in rows}, {row: [] for row in rows}
        for r in range(rounds):
            for row in rows[r % len(rows) :] + rows[: r % len(rows)]:
                one = run_prefill(name, row, P)
                seconds[row].append(one["seconds"])
                peak[row].append(one["peak_mb"])
        time_s = {row: statistics.median(seconds[row]) for row in rows}
        peak_mb = {row: max(peak[row]) for row in rows}
        above = {row: peak_mb[row] - baseline for row in rows}
        for row in rows:
            print(
                f"| {name} | {row} | {time_s[row]:.1f} | {time_s[row] / time_s['nope']:.2f}x "
                f"| {peak_mb[row]:.0f} | {above[row]:.0f} | {peak_mb[row] / peak_mb['nope']:.2f}x "
                f"| {above[row] / above['nope']:.2f}x |",
                flush=True,
            )
        results.append(dict(preset=name, baseline_mb=baseline, seconds=seconds, peak_mb=peak_mb))
    if as_json:
        print(json.dumps(dict(prompt=P, rounds=rounds, results=results)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short generations, a sanity run")
    parser.add_argument("--priors", action="store_true", help="section 3 only: decoding with every prior")
    parser.add_argument("--preset", default="tiny", help="section 3's model size (default tiny)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384, 32768])
    parser.add_argument("--steps", type=int, default=1, help="section 3: decode steps per round")
    parser.add_argument("--rounds", type=int, help="sections 3 and 4: rounds (default 100 and 1)")
    parser.add_argument("--json", action="store_true", help="section 3's or 4's results as JSON, last line")
    parser.add_argument("--prefill", action="store_true", help="section 4 only: prefill with every prior")
    parser.add_argument("--presets", nargs="+", default=["tiny", "small"], help="section 4's model sizes")
    parser.add_argument("--prompt", type=int, default=32768, help="section 4: prompt length")
    parser.add_argument("--one", nargs=3, metavar=("PRESET", "ROW", "P"), help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.one:
        name, row, P = args.one
        prefill_one(name, row, int(P))
        return
    if args.prefill:
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
        print_prefill(args.presets, args.prompt, args.rounds or 1, args.json)
        return
    if args.priors:
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
        print_prior_decode(args.preset, args.lengths, args.steps, args.rounds or 100, args.json)
        return
    generations, prompts, rounds, steps = [2048, 4096, 8192], [4096, 16384], 3, 32
    if args.quick:
        generations, prompts, rounds, steps = [512, 1024], [1024], 2, 8
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("\n1. The cache alone (B1 Hkv4 D64 float32), a generation of N tokens, extend per token:\n")
    print("| N | concat us/token | in place us/token | time ratio | concat KB/token | in place KB/token |")
    print("|---:|---:|---:|---:|---:|---:|")
    for N in generations:
        result = cache_alone(N, rounds)
        (t_cat, b_cat), (t_new, b_new) = result["concat"], result["in place"]
        print(
            f"| {N} | {t_cat * 1e6:.1f} | {t_new * 1e6:.1f} | {t_cat / t_new:.1f}x "
            f"| {b_cat / 1024:.0f} | {b_new / 1024:.1f} |"
        )
    print(f"\n2. The small preset with GOAT, {steps} decode steps after a P-token prefill, per step:\n")
    print("| P | concat ms/step | in place ms/step | time ratio | concat MB/step | in place MB/step |")
    print("|---:|---:|---:|---:|---:|---:|")
    for P in prompts:
        result = model_decode(P, steps, rounds)
        (t_cat, b_cat), (t_new, b_new) = result["concat"], result["in place"]
        print(
            f"| {P} | {t_cat * 1e3:.1f} | {t_new * 1e3:.1f} | {t_cat / t_new:.2f}x "
            f"| {b_cat / 2**20:.1f} | {b_new / 2**20:.2f} |"
        )


if __name__ == "__main__":
    main()
