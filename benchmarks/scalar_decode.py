"""Per-token decoding through the sorted scalar-key cache against dense attention over the same cache.

For each cache length n, one process prefills a ``SortedScalarCache`` and a dense cache (scalar keys
``(Hk, n)`` and values ``(G, n, Dv)`` in arrival order, preallocated) with the same tokens, then
alternates, round by round:

- sorted: ``--steps`` decoding steps, each appending one token (buffer write, and the amortized
  merge: with ``--steps`` = ``--buffer-size`` every block holds exactly one merge) and decoding one
  query over its ``--window`` nearest keys per head;
- dense: a few steps, each writing one token into the preallocated cache and attending over all of it.

It reports medians over rounds of the per-token time, their ratio (the speedup), keys and value rows
read per step, the attention mass the window holds (exact, from the dense weights of sampled
queries, and the cache's own lower bound), and the memory of both caches.

Keys: ``--keys FILE`` reads a safetensors file with ``k_s`` ``(N, Hk)`` scalar keys (optionally
``q_s`` ``(M, H)`` queries and ``tau`` ``(H,)``), e.g. exported from a trained model. Without it the
keys are SYNTHETIC: uniform on [-3, 3] (the fixed target range of seed 002's L_spread, which pushes
sorted keys to uniform quantiles), queries from the same distribution, and ``--tau``.

    python benchmarks/scalar_decode.py                       # n = 1e3 .. 1e6, about a minute
    python benchmarks/scalar_decode.py --json                # the last line is JSON
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from priorattn.scalar.sorted_cache import SortedScalarCache, scalar_attention_reference

SPREAD = 3.0  # synthetic keys and queries are uniform on [-SPREAD, SPREAD]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, nargs="+", default=[1000, 10_000, 100_000, 1_000_000])
    parser.add_argument("--heads", type=int, default=4, help="H scalar query heads")
    parser.add_argument("--key-heads", type=int, default=None, help="Hk sort orders (default H: per head)")
    parser.add_argument("--groups", type=int, default=1, help="G value groups")
    parser.add_argument("--value-dim", type=int, default=64)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--tau", type=float, default=2.5e-7, help="synthetic keys only")
    parser.add_argument("--buffer-size", type=int, default=256)
    parser.add_argument(
        "--steps", type=int, default=None, help="sorted steps per round (default buffer size)"
    )
    parser.add_argument("--dense-steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--mass-queries", type=int, default=20, help="queries whose exact mass is measured")
    parser.add_argument("--keys", type=Path, default=None, help="safetensors file with k_s (N, Hk)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the results as JSON on the last line")
    args = parser.parse_args(argv)
    args.key_heads = args.heads if args.key_heads is None else args.key_heads
    args.steps = args.buffer_size if args.steps is None else args.steps
    return args


class KeySource:
    """Scalar keys, queries and tau: from ``--keys`` or the synthetic distribution."""

    def __init__(self, args: argparse.Namespace):
        self.H, self.Hk = args.heads, args.key_heads
        self.file = None if args.keys is None else load_file(str(args.keys))
        if self.file is not None:
            k_s = self.file.get("k_s")
            if k_s is None or k_s.dim() != 2 or k_s.shape[1] != self.Hk:
                got = None if k_s is None else tuple(k_s.shape)
                raise SystemExit(f"{args.keys}: needs a tensor k_s of shape (N, {self.Hk}), got {got}")
            self.keys = k_s.float()
        self.tau = (
            self.file["tau"].float()
            if self.file is not None and "tau" in self.file
            else torch.tensor(args.tau)
        )
        self.generator = torch.Generator().manual_seed(args.seed)

    @property
    def available(self) -> int:
        return math.inf if self.file is None else self.keys.shape[0]

    def keys_of(self, start: int, stop: int) -> torch.Tensor:  # (L, Hk)
        if self.file is not None:
            return self.keys[start:stop]
        return (torch.rand(stop - start, self.Hk, generator=self.generator) * 2 - 1) * SPREAD

    def query(self) -> torch.Tensor:  # (H,)
        if self.file is not None and "q_s" in self.file:
            q_s = self.file["q_s"]
            return q_s[torch.randint(q_s.shape[0], (), generator=self.generator)].float()
        if self.file is not None:  # queries drawn from the keys' own distribution
            rows = torch.randint(self.keys.shape[0], (self.H,), generator=self.generator)
            return self.keys[rows, torch.arange(self.H) // (self.H // self.Hk)]
        return (torch.rand(self.H, generator=self.generator) * 2 - 1) * SPREAD


def exact_mass_captured(q_s, tau, keys, window, H) -> torch.Tensor:
    """Exact attention mass on the ``window`` nearest keys per head, from all ``keys (Hk, n)``."""
    keys = keys.repeat_interleave(H // keys.shape[0], dim=0).double()
    q = q_s.double()[:, None]
    weights = torch.softmax(-((q - keys) ** 2) / tau.double().expand(H)[:, None], dim=-1)
    nearest = (q - keys).abs().topk(window, dim=1, largest=False).indices
    return weights.gather(1, nearest).sum(dim=1)


def run_length(n: int, args: argparse.Namespace, source: KeySource) -> dict:
    H, Hk, G, Dv = args.heads, args.key_heads, args.groups, args.value_dim
    added = args.rounds * args.steps
    capacity = n + added
    k_s = source.keys_of(0, capacity)  # (n + added, Hk): the prefill, then the decoded tokens
    values = torch.randn(capacity, G, Dv, generator=source.generator)
    cache = SortedScalarCache(H, G, Dv, num_key_heads=Hk, buffer_size=args.buffer_size, capacity=capacity)
    cache.append(k_s[:n], values[:n])
    dense_keys = k_s.T.contiguous()  # (Hk, capacity): a dense cache in arrival order
    dense_values = values.transpose(0, 1).contiguous()  # (G, capacity, Dv)
    tau = source.tau
    length = n
    sorted_times, dense_times, keys_read, rows_read, bounds = [], [], [], [], []
    for _ in range(args.rounds):
        queries, steps = [source.query() for _ in range(args.steps)], []
        start = time.perf_counter()
        for i, q in enumerate(queries):
            cache.append(k_s[length + i], values[length + i])
            steps.append(cache.decode(q, tau, args.window))
        sorted_times.append((time.perf_counter() - start) / args.steps)
        keys_read += [step.keys_read for step in steps]
        rows_read += [step.rows_read for step in steps]
        bounds += [step.mass_captured_bound.min().item() for step in steps]
        length += args.steps
        start = time.perf_counter()
        for _ in range(args.dense_steps):
            q = source.query()
            dense_keys[:, length - 1] = k_s[length - 1]  # write the step's token (already there)
            dense_values[:, length - 1] = values[length - 1]
            scalar_attention_reference(q, tau, dense_keys[:, :length], dense_values[:, :length])
        dense_times.append((time.perf_counter() - start) / args.dense_steps)
    exact = []
    for _ in range(args.mass_queries):
        q = source.query()
        exact.append(exact_mass_captured(q, tau, dense_keys[:, :length], min(args.window, length), H))
        bounds.append(cache.decode(q, tau, args.window).mass_captured_bound.min().item())
    exact = torch.cat(exact)
    # Both caches hold the same tokens in tables of the same capacity (n + the decoded tokens).
    sorted_bytes, dense_bytes = cache.nbytes(), dense_keys.nbytes + dense_values.nbytes
    sorted_s, dense_s = statistics.median(sorted_times), statistics.median(dense_times)
    return {
        "n": n,
        "sorted_us": sorted_s * 1e6,
        "dense_us": dense_s * 1e6,
        "speedup": dense_s / sorted_s,
        "keys_read": statistics.median(keys_read),
        "dense_keys_read": Hk * length,
        "rows_read": statistics.median(rows_read),
        "dense_rows_read": G * length,
        "mass_captured": exact.min().item(),
        "mass_captured_median": exact.median().item(),
        "mass_captured_bound": min(bounds),
        "sorted_mb": sorted_bytes / 2**20,
        "dense_mb": dense_bytes / 2**20,
        "memory_ratio": sorted_bytes / dense_bytes,
    }


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    source = KeySource(args)
    keys_note = f"keys from {args.keys}" if args.keys else f"SYNTHETIC keys uniform on [-{SPREAD}, {SPREAD}]"
    print(
        f"# {keys_note}; tau {source.tau.tolist()}; H={args.heads} Hk={args.key_heads} G={args.groups} "
        f"Dv={args.value_dim} window={args.window} buffer={args.buffer_size} float32, "
        f"{torch.get_num_threads()} thread(s); medians of {args.rounds} rounds"
    )
    header = (
        "| n | sorted us/token | dense us/token | speedup | keys read (sorted / dense) | "
        "value rows read | mass captured (min / median, exact) | captured bound (min) | memory MB "
        "(sorted / dense) |"
    )
    print(header)
    print("|" + "---:|" * 9)
    rows = []
    for n in args.n:
        if n + args.rounds * args.steps > source.available:
            needed = n + args.rounds * args.steps
            print(f"| {n} | skipped: the keys file holds {source.available} keys, {needed} needed |")
            continue
        r = run_length(n, args, source)
        rows.append(r)
        print(
            f"| {n} | {r['sorted_us']:.0f} | {r['dense_us']:.0f} | {r['speedup']:.1f}x | "
            f"{r['keys_read']} / {r['dense_keys_read']} | {r['rows_read']} / {r['dense_rows_read']} | "
            f"{r['mass_captured']:.6f} / {r['mass_captured_median']:.6f} | {r['mass_captured_bound']:.6f} | "
            f"{r['sorted_mb']:.1f} / {r['dense_mb']:.1f} ({r['memory_ratio']:.3f}x) |",
            flush=True,
        )
    if args.json:
        print(json.dumps({key: [r[key] for r in rows] for key in (rows[0] if rows else {"n": 0})}))


if __name__ == "__main__":
    main()
