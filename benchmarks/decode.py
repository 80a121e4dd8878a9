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

    python benchmarks/decode.py            # N = 2048 4096 8192, P = 4096 16384, 3 rounds, ~6 minutes
    python benchmarks/decode.py --quick    # N = 512 1024, P = 1024, 2 rounds
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short generations, a sanity run")
    args = parser.parse_args()
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
