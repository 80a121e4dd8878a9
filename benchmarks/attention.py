"""Forward+backward time and peak memory of every prior and route, as a ratio to plain causal SDPA.

For each sequence length L, every (prior, backend) pair runs one forward and one backward pass of
``priorattn.attention`` (B=1, H=4, head width 64, causal). Its time is compared with plain causal
SDPA (Uniform prior, backend "sdpa") of the same total head width, side by side in one process:
the routes of one L are timed round-robin (the order rotating each round), several rounds, and
the medians are reported.

Peak memory is the peak RSS of a fresh subprocess (``--one PRIOR BACKEND L``) that warms up at a
shorter length and then runs one forward+backward at L. It includes the interpreter and torch, so
a baseline subprocess that only imports and allocates the inputs is printed too.

Three whole-layer rows compare with the official GOAT package (``pip install --no-deps
goat-attention``): its ``goat.GoatAttention`` against ``priorattn.PriorMultiheadAttention`` with the
GOAT prior, both with their q/k/v/out projections, and the priorattn layer without a prior (plain
causal SDPA) as their baseline.

    python benchmarks/attention.py              # L = 1024 4096 16384, about 15 minutes
    python benchmarks/attention.py --quick      # L = 512 1024, a sanity run
    python benchmarks/attention.py --lengths 16384 --priors ALiBi GOAT --backends sdpa  # some rows
    OMP_NUM_THREADS=1 python benchmarks/attention.py --lengths 4096 --priors T5 KERPLE --backends memeff \
        --no-memory --threads 1 --clock cpu       # on a loaded machine: CPU time on one thread
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import resource
import statistics
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn
from tqdm import tqdm

import priorattn
from priorattn.priors import GGD, GOAT, KERPLE, ALiBi, Prior, T5Bias, Uniform

ROOT = Path(__file__).resolve().parent.parent
BATCH, HEADS, HEAD_WIDTH = 1, 4, 64
GOAT_FREQS = 8
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
#: The reference route is skipped when its dense float32 logits alone would exceed this.
DENSE_LIMIT_GB = 2.0
#: Each timed sample repeats a route until it has run at least this long (fast routes at small L).
MIN_SAMPLE_S = 0.5
#: Warm-ups (of the timing and of the memory subprocesses) run at most this long a sequence.
WARM_UP_LENGTH = 1024
TIME_TARGET_GOAT_SDPA = 1.05
TIME_TARGET_MEMEFF = 1.3
#: Issue 24's target for the relative priors it adds, through the lag table of ``memeff``.
TIME_TARGET_LAG_TABLE = {"T5": 1.5, "KERPLE": 1.5}
MEM_TARGET_MEMEFF = 1.15
MEM_TARGET_LENGTH = 16384

Run = Callable[[], None]
Clock = Callable[[], float]
#: ``--clock``: wall-clock seconds, or the process's CPU seconds (all its threads together: on one
#: thread, what a route costs whatever else the machine runs).
CLOCKS: dict[str, Clock] = {"wall": time.perf_counter, "cpu": time.process_time}


@dataclass(frozen=True)
class Case:
    """One row of the table: a prior (or a whole layer) through one backend."""

    prior: str
    backend: str
    layer: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return self.prior, self.backend


PLAIN = Case("Uniform", "sdpa")
PLAIN_LAYER = Case("layer-plain", "sdpa", layer=True)
GOAT_LAYER = Case("layer-GOAT", "sdpa", layer=True)
PEER_LAYER = Case("goat-attention", "sdpa", layer=True)
BASELINE = Case("baseline", "none")
LABELS = {
    "layer-plain": "layer: plain",
    "layer-GOAT": "layer: priorattn GOAT",
    "goat-attention": "layer: goat-attention (peer)",
    "baseline": "baseline (import + inputs)",
}


# ---------------------------------------------------------------------------------------------
# Building the routes


def make_prior(name: str) -> Prior:
    if name == "Uniform":
        return Uniform()
    if name == "ALiBi":
        return ALiBi(HEADS)
    if name == "GGD":
        return GGD(HEADS, init="alibi")
    if name == "GGD-flat":  # as GGD starts in training: a constant bias, no key can be skipped
        return GGD(HEADS, init="uniform")
    if name == "GOAT":
        return GOAT(HEADS, num_freqs=GOAT_FREQS, init="alibi")
    if name == "T5":  # the defaults: 32 causal buckets up to distance 128
        return T5Bias(HEADS)
    if name == "KERPLE":  # the logarithmic variant, at the authors' random start
        return KERPLE(HEADS, variant="log")
    raise ValueError(f"unknown prior {name!r}")


def qk_width(prior: Prior) -> int:
    """Content width of q/k: GOAT gives up lanes to its fold, so the total head width stays 64."""
    return HEAD_WIDTH - prior.fold_width if isinstance(prior, GOAT) else HEAD_WIDTH


def op_cases() -> list[Case]:
    """Every prior through every backend it supports (sdpa only where the prior folds)."""
    cases = []
    for name in ("Uniform", "ALiBi", "GGD", "GGD-flat", "GOAT", "T5", "KERPLE"):
        backends = ["sdpa"] if make_prior(name).can_fold(True) else []
        cases += [Case(name, b) for b in (*backends, "memeff", "reference")]
    return cases


def dense_gb(L: int) -> float:
    """Size of the reference route's float32 ``(B, H, L, L)`` logits."""
    return BATCH * HEADS * L * L * 4 / 1e9


def leaf(*shape: int, dtype: torch.dtype) -> Tensor:
    return torch.randn(*shape, dtype=dtype).requires_grad_()


def backward_runner(
    forward: Callable[[], Tensor], leaves: list[Tensor], dtype: torch.dtype, shape: tuple[int, ...]
) -> Run:
    """One forward+backward with a fixed output gradient; gradients are reset before each call."""
    grad_out = torch.randn(shape, dtype=dtype)

    def run() -> None:
        for t in leaves:
            t.grad = None
        forward().backward(grad_out)

    return run


def build_op(case: Case, L: int, dtype: torch.dtype) -> Run:
    prior = make_prior(case.prior)
    dk = qk_width(prior)
    q = leaf(BATCH, HEADS, L, dk, dtype=dtype)
    k = leaf(BATCH, HEADS, L, dk, dtype=dtype)
    v = leaf(BATCH, HEADS, L, HEAD_WIDTH, dtype=dtype)
    leaves = [q, k, v, *(p for p in prior.parameters() if p.requires_grad)]

    def forward() -> Tensor:
        return priorattn.attention(q, k, v, prior=prior, causal=True, backend=case.backend)

    return backward_runner(forward, leaves, dtype, (BATCH, HEADS, L, HEAD_WIDTH))


class ProjectedAttention(nn.Module):
    """A GOAT-style layer: q/k/v/out projections around ``priorattn.attention``.

    q and k project to ``qk_width`` per head (64 minus the prior's fold lanes), v to 64, as the
    official GoatAttention does, so every layer keeps a total head width of 64.
    """

    def __init__(self, embed_dim: int, num_heads: int, prior: Prior, backend: str):
        super().__init__()
        self.num_heads, self.prior, self.backend = num_heads, prior, backend
        dk = qk_width(prior)
        self.q_proj = nn.Linear(embed_dim, num_heads * dk)
        self.k_proj = nn.Linear(embed_dim, num_heads * dk)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def heads(self, x: Tensor) -> Tensor:
        B, L, _ = x.shape
        return x.view(B, L, self.num_heads, -1).transpose(1, 2)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = (self.heads(p(x)) for p in (self.q_proj, self.k_proj, self.v_proj))
        out = priorattn.attention(q, k, v, prior=self.prior, causal=True, backend=self.backend)
        return self.out_proj(out.transpose(1, 2).flatten(2))


def library_layer(prior: Prior) -> tuple[Callable[[Tensor], Tensor], nn.Module] | None:
    """``priorattn.PriorMultiheadAttention`` when the library has one and it runs, else None."""
    cls = getattr(priorattn, "PriorMultiheadAttention", None)
    if cls is None:
        return None
    try:
        module = cls(HEADS * HEAD_WIDTH, HEADS, prior=prior, backend="sdpa")

        def forward(x: Tensor) -> Tensor:
            out = module(x)
            return out[0] if isinstance(out, tuple) else out

        forward(torch.randn(BATCH, 8, HEADS * HEAD_WIDTH))
    except Exception as exc:  # an API we did not guess: fall back to our own projections
        print(
            f"note: PriorMultiheadAttention did not run ({exc!r}); using nn.Linear projections",
            file=sys.stderr,
        )
        return None
    return forward, module


def goat_peer() -> type | None:
    try:
        from goat import GoatAttention
    except ImportError:
        return None
    return GoatAttention


def layer_forward(case: Case, dtype: torch.dtype) -> tuple[Callable[[Tensor], Tensor], nn.Module]:
    E = HEADS * HEAD_WIDTH
    if case == PEER_LAYER:
        peer = goat_peer()(E, HEADS, pos_rank=GOAT_FREQS, abs_rank=GOAT_FREQS, batch_first=True)
        peer = peer.to(dtype)
        return (lambda x: peer(x, x, x, need_weights=False, is_causal=True)[0]), peer
    prior = make_prior("GOAT" if case == GOAT_LAYER else "Uniform")
    forward, module = library_layer(prior) or (None, None)
    if module is None:
        forward = module = ProjectedAttention(E, HEADS, prior, case.backend)
    module.to(dtype)
    prior.float()  # as in the op rows, the prior stays float32; the routes cast what they use
    return forward, module


def build_layer(case: Case, L: int, dtype: torch.dtype) -> Run:
    forward, module = layer_forward(case, dtype)
    x = leaf(BATCH, L, HEADS * HEAD_WIDTH, dtype=dtype)
    leaves = [x, *module.parameters()]
    return backward_runner(lambda: forward(x), leaves, dtype, (BATCH, L, HEADS * HEAD_WIDTH))


def build(case: Case, L: int, dtype: torch.dtype) -> Run:
    return build_layer(case, L, dtype) if case.layer else build_op(case, L, dtype)


def all_cases(with_peer: bool) -> list[Case]:
    layers = [PLAIN_LAYER, GOAT_LAYER, *([PEER_LAYER] if with_peer else [])]
    return [*op_cases(), *layers]


def selected_cases(cases: list[Case], priors: list[str] | None, backends: list[str] | None) -> list[Case]:
    """The cases the filters name, plus the plain SDPA baselines their ratios need."""
    chosen = [
        case
        for case in cases
        if (priors is None or case.prior in priors) and (backends is None or case.backend in backends)
    ]
    bases = [base for base in (PLAIN, PLAIN_LAYER) if any(c.layer == base.layer for c in chosen)]
    return [case for case in cases if case in chosen or case in bases]


def find_case(prior: str, backend: str) -> Case:
    for case in [*all_cases(with_peer=True), BASELINE]:
        if case.key == (prior, backend):
            return case
    raise SystemExit(f"unknown case {prior} {backend}")


def skip_reason(case: Case, L: int) -> str | None:
    if case.backend == "reference" and dense_gb(L) > DENSE_LIMIT_GB:
        return f"skipped (dense bias would need {dense_gb(L):.1f} GB)"
    return None


# ---------------------------------------------------------------------------------------------
# Time: round-robin in one process


def warm_up(case: Case, L: int, dtype: torch.dtype, clock: Clock) -> int:
    """Run the route once at ``min(L, WARM_UP_LENGTH)``; return how often a sample repeats it.

    Warming up at a shorter length loads every kernel the route uses without paying a whole
    extra pass at long L. A sample repeats a route until it lasts at least MIN_SAMPLE_S, judged
    from the warm-up time scaled quadratically to L.
    """
    short = min(L, WARM_UP_LENGTH)
    run = build(case, short, dtype)
    start = clock()
    run()
    estimate = (clock() - start) * (L / short) ** 2
    return max(1, min(50, math.ceil(MIN_SAMPLE_S / estimate)))


def sample(run: Run, repeats: int, clock: Clock) -> float:
    start = clock()
    for _ in range(repeats):
        run()
    return (clock() - start) / repeats


def failure(exc: Exception) -> str:
    return f"failed: {type(exc).__name__}: {exc}"[:120]


def time_routes(
    cases: list[Case], L: int, dtype: torch.dtype, rounds: int, bar: tqdm, clock: Clock
) -> tuple[dict[Case, list[float]], dict[Case, str]]:
    """Seconds per sample of every route (by ``clock``) and the failures; the order rotates each round."""
    runs: dict[Case, Run] = {}
    repeats: dict[Case, int] = {}
    errors: dict[Case, str] = {}
    for case in cases:
        bar.set_postfix_str(f"warm-up {case.prior}/{case.backend}")
        try:  # a failing route is a row of the table, not a crash
            repeats[case] = warm_up(case, L, dtype, clock)
            torch.manual_seed(0)
            runs[case] = build(case, L, dtype)
        except Exception as exc:
            errors[case] = failure(exc)
    times: dict[Case, list[float]] = {case: [] for case in runs}
    for r in range(rounds):
        order = [case for case in runs if case not in errors]
        for case in order[r % len(order) :] + order[: r % len(order)]:
            bar.set_postfix_str(f"round {r + 1} {case.prior}/{case.backend}")
            try:
                times[case].append(sample(runs[case], repeats[case], clock))
            except Exception as exc:
                errors[case] = failure(exc)
            bar.update()
    return times, errors


# ---------------------------------------------------------------------------------------------
# Memory: one fresh subprocess per route


def peak_rss_mb() -> float:
    """Peak RSS of this process in MB.

    ``/proc/self/status`` VmHWM, not ``ru_maxrss``: on Linux ``ru_maxrss`` survives fork and exec,
    so a child started by a large parent would report the parent's peak.
    """
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # no /proc: kB on Linux


def run_one(case: Case, L: int, dtype: torch.dtype) -> None:
    """Child process: warm up, run one measured forward+backward, print the peak RSS as JSON.

    The warm-up runs at ``min(L, WARM_UP_LENGTH)``: it loads the kernels, and the measured pass is
    the first at full length, so the peak is one pass's own and not a pass plus leftovers.
    """
    torch.manual_seed(0)
    if case == BASELINE:
        build_op(PLAIN, L, dtype)  # inputs only
    else:
        build(case, min(L, WARM_UP_LENGTH), dtype)()
        build(case, L, dtype)()
    print(json.dumps({"peak_mb": peak_rss_mb()}))


def measure_memory(case: Case, L: int, dtype_name: str) -> float | str:
    cmd = [
        sys.executable,
        __file__,
        "--one",
        case.prior,
        case.backend,
        str(L),
        "--dtype",
        dtype_name,
        "--threads",
        str(torch.get_num_threads()),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
        return f"memory run failed: {tail[0][:100]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])["peak_mb"]


# ---------------------------------------------------------------------------------------------
# The table


@dataclass
class Row:
    case: Case
    L: int
    seconds: float | None = None
    time_ratio: float | None = None
    peak_mb: float | None = None
    mem_ratio: float | None = None
    note: str = ""


def target(row: Row, peer: Row | None) -> str:
    """Which of the issue's targets apply to this row, and whether it meets them."""
    case = row.case
    if row.time_ratio is None:
        return ""
    checks = []
    if case == Case("GOAT", "sdpa"):
        checks.append(("time", row.time_ratio, TIME_TARGET_GOAT_SDPA))
    elif case.backend == "memeff":
        limit = TIME_TARGET_LAG_TABLE.get(case.prior, TIME_TARGET_MEMEFF)
        checks.append(("time", row.time_ratio, limit))
        if row.L == MEM_TARGET_LENGTH and row.mem_ratio is not None:
            checks.append(("mem", row.mem_ratio, MEM_TARGET_MEMEFF))
    elif case == GOAT_LAYER and peer is not None and peer.seconds is not None:
        return f"{row.seconds / peer.seconds:.2f}x goat-attention time"
    if not checks:
        return ""
    missed = [f"{name} {value:.2f}x > {limit:.2f}x" for name, value, limit in checks if value > limit]
    return "no: " + ", ".join(missed) if missed else "yes"


def fmt(value: float | None, spec: str) -> str:
    return "" if value is None else format(value, spec)


def markdown(rows: list[Row]) -> str:
    columns = ("prior", "backend", "L", "fwd+bwd s", "time x SDPA", "peak MB", "mem x SDPA", "target met?")
    lines = ["| " + " | ".join(columns) + " |", "|---|---|---:|---:|---:|---:|---:|---|"]
    peers = {row.L: row for row in rows if row.case == PEER_LAYER}
    for row in rows:
        name = LABELS.get(row.case.prior, row.case.prior)
        met = row.note or target(row, peers.get(row.L))
        lines.append(
            f"| {name} | {row.case.backend} | {row.L} | {fmt(row.seconds, '.4f')} | "
            f"{fmt(row.time_ratio, '.2f')} | {fmt(row.peak_mb, '.0f')} | "
            f"{fmt(row.mem_ratio, '.2f')} | {met} |"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Driver


def bench_length(L: int, args: argparse.Namespace, cases: list[Case], bar: tqdm) -> list[Row]:
    dtype = DTYPES[args.dtype]
    rows = {case: Row(case, L, note=skip_reason(case, L) or "") for case in cases}
    timed = [case for case in cases if not rows[case].note]
    bar.total += (len(timed) - len(cases)) * args.rounds  # skipped routes take no rounds
    times, errors = time_routes(timed, L, dtype, args.rounds, bar, CLOCKS[args.clock])
    for case, message in errors.items():
        rows[case].note = message
    for case, row in rows.items():
        if times.get(case):
            base = PLAIN_LAYER if case.layer else PLAIN
            row.seconds = statistics.median(times[case])
            if times.get(base):
                row.time_ratio = row.seconds / statistics.median(times[base])
    if not args.no_memory:
        measure_rows(L, args.dtype, rows, bar)
    return list(rows.values())


def measure_rows(L: int, dtype_name: str, rows: dict[Case, Row], bar: tqdm) -> None:
    baseline = Row(BASELINE, L)
    for case, row in [*rows.items(), (BASELINE, baseline)]:
        if row.note and case != BASELINE:
            continue
        bar.set_postfix_str(f"memory {case.prior}/{case.backend}")
        peak = measure_memory(case, L, dtype_name)
        if isinstance(peak, str):
            row.note = peak
        else:
            row.peak_mb = peak
    for case, row in [*rows.items(), (BASELINE, baseline)]:
        base = rows.get(PLAIN_LAYER if case.layer else PLAIN)
        if row.peak_mb is not None and base is not None and base.peak_mb:
            row.mem_ratio = row.peak_mb / base.peak_mb
    rows[BASELINE] = baseline


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per route (median)")
    parser.add_argument("--quick", action="store_true", help="lengths 512 1024: a sanity run")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory subprocesses")
    parser.add_argument("--priors", nargs="+", help="only these priors or layer rows (e.g. ALiBi layer-GOAT)")
    parser.add_argument("--backends", nargs="+", help="only these backends (e.g. sdpa memeff)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's own choice)")
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="time by the wall clock or by process CPU time (use with --threads 1 on a loaded machine)",
    )
    parser.add_argument(
        "--one",
        nargs=3,
        metavar=("PRIOR", "BACKEND", "L"),
        help="internal: measure one route's peak RSS in this process",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.lengths = [512, 1024]
    return args


def header(args: argparse.Namespace, with_peer: bool, library: str) -> str:
    layer = (
        "priorattn.PriorMultiheadAttention"
        if hasattr(priorattn, "PriorMultiheadAttention")
        else "nn.Linear projections + priorattn.functional (benchmarks/attention.py)"
    )
    peer = (
        "goat-attention " + _peer_version()
        if with_peer
        else "goat-attention not installed: peer rows skipped (pip install --no-deps goat-attention)"
    )
    return "\n".join(
        [
            f"# benchmarks/attention.py, {datetime.date.today().isoformat()}",
            f"command: python {' '.join(sys.argv)}",
            f"machine: {platform.machine()}, {torch.get_num_threads()} torch threads, "
            f"torch {torch.__version__}, python {platform.python_version()}",
            f"priorattn: {library}",
            f"shape: B={BATCH} H={HEADS} head width {HEAD_WIDTH}, causal, {args.dtype}; "
            f"GOAT q/k content width {qk_width(make_prior('GOAT'))} + fold lanes; "
            f"rounds={args.rounds}, clock: {args.clock}",
            f"layers: {layer}; peer: {peer}",
            "time x SDPA: median seconds over Uniform/sdpa's at the same L (layer rows: over "
            "'layer: plain'); mem x SDPA: subprocess peak RSS ratio, same baselines",
        ]
    )


def library_state() -> str:
    """The library's git commit, plus the files under src/ that differ from it."""

    def git(*cmd: str) -> str:
        try:
            return subprocess.run(
                ["git", *cmd], capture_output=True, text=True, check=True, cwd=ROOT
            ).stdout.rstrip()
        except (OSError, subprocess.CalledProcessError):
            return ""

    commit = git("rev-parse", "--short", "HEAD") or "unknown commit"
    changed = [line[3:] for line in git("status", "--porcelain", "--", "src").splitlines()]
    return f"{commit} + uncommitted changes to {', '.join(changed)}" if changed else commit


def library_fingerprint() -> int:
    """A checksum of the library's source: the memory subprocesses import whatever is there."""
    checksum = 0
    for path in sorted((ROOT / "src").rglob("*.py")):
        checksum = zlib.crc32(path.read_bytes(), zlib.crc32(str(path).encode(), checksum))
    return checksum


def _peer_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("goat-attention")
    except PackageNotFoundError:
        return "(unknown version)"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    dtype = DTYPES[args.dtype]
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.one:
        prior, backend, L = args.one
        run_one(find_case(prior, backend), int(L), dtype)
        return
    start = time.perf_counter()
    library, fingerprint = library_state(), library_fingerprint()
    with_peer = goat_peer() is not None
    if not with_peer:
        print("note: goat-attention is not installed; the peer rows are skipped", file=sys.stderr)
    cases = selected_cases(all_cases(with_peer), args.priors, args.backends)
    rows = []
    with tqdm(total=len(cases) * args.rounds * len(args.lengths), file=sys.stderr, unit="sample") as bar:
        for L in args.lengths:
            bar.set_description(f"L={L}")
            rows += bench_length(L, args, cases, bar)
    print(header(args, with_peer, library))
    print()
    print(markdown(rows))
    print()
    if library_fingerprint() != fingerprint:
        print(
            f"WARNING: the library's source changed during the run (now {library_state()}): "
            "this process timed the code of its start, the memory subprocesses imported "
            "whatever was there at their time. Re-run on a quiet tree."
        )
    print(f"total wall time: {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
