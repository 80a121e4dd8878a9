"""Operations per attention call on the GPU routes, counted on the CPU: the fixed per-call work that
dominates the prior routes on a GPU at 1k-4k tokens.

    PYTHONPATH=src python benchmarks/launches.py [--json FILE] [--before FILE] [--host]

Every aten operation that does work (not a view, not an allocation) is one kernel launch on a GPU,
whatever the tensors' sizes, so their number per call is what the GPU's fixed cost grows with. For
every prior of the device check (``device_check.priors``: NoPE, ALiBi, GGD, GOAT with and without
its slope, ALiBi + GOAT, GOAT + SSMax, T5, KERPLE, Sandwich, FIRE, FoX's key bias) it counts the
operations ``priorattn.attention`` issues on

- the ``triton`` route, forward and forward + backward: each launch of its Triton kernels counts as
  one kernel and is skipped (the operations around the kernels do not depend on what they would
  write; ``TRITON_INTERPRET=1``, set here before Triton is imported, lets the route run on the CPU);
- the ``flex`` route, forward, where it computes the prior: FlexAttention's compiled kernel is
  replaced by a stand-in that counts one launch (its inputs are the route's, its output zeros), and
  the block mask is the route's per-shape cache, warm.

Both run as on CUDA (``as_on_cuda``): no value is read back (``values_are_free`` is false), so the
routes take the paths they take on a GPU. Each cell, for the forward pass and for forward +
backward: ``prep``, the operations outside the route's kernels that launch a kernel on a GPU;
``kernels``, the route's own (Triton's, FlexAttention's); ``views``, views, allocations and
operations that make only empty tensors (no launch); ``reads``, host reads of a value (a GPU sync);
and ``prior``, how many of ``prep`` ran in the prior's own methods (``priors/``; forward only:
autograd's engine runs the backward without the prior's frames). ``--host`` adds the CPU time of
one forward + backward with the kernels skipped (the preparation alone), one thread,
``torch.utils.benchmark`` median: a proxy for the host time a GPU waits on, meaningful on a quiet
machine only. Sizes: B 1, H 8, L 40, head width 64 (a folding prior's lanes come out of it, as in
the device check), bfloat16, causal; counts do not depend on them. Results: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections import Counter
from unittest import mock

os.environ.setdefault("TRITON_INTERPRET", "1")  # Triton reads it when it is imported

import torch
from device_check import FOX, fox_key_bias, priors  # this script's directory is on sys.path
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.benchmark import Timer

import priorattn
from priorattn.functional import api, flex, masks, prior_inputs, spans, triton_backward, triton_forward
from priorattn.functional.masks import Masking

aten = torch.ops.aten
#: Operations that allocate without touching memory: no kernel on a GPU.
ALLOCATIONS = {
    aten.empty.memory_format,
    aten.empty_like.default,
    aten.empty_strided.default,
    aten.new_empty.default,
    aten.new_empty_strided.default,
    aten._unsafe_view.default,
    aten.lift_fresh.default,
}
#: Operations that read a value back to the host: on a GPU the host waits for the queue to drain.
READS = {aten._local_scalar_dense.default, aten.equal.default, aten.is_nonzero.default}
#: Operations on dtypes or shapes, not tensors.
NO_TENSOR = {aten.promote_types.default, aten.result_type.Tensor, aten.result_type.Scalar}
#: The triton route's kernels: what it launches (its helpers are jitted too, but never launched).
KERNELS = [
    (m, name) for m in (triton_forward, triton_backward) for name in vars(m) if name.endswith("_kernel")
]


class Count(TorchDispatchMode):
    """Counts the aten operations dispatched while it is active, by kind (``prep``, ``views``,
    ``reads``), and the route's kernel launches (``kernels``), which :meth:`kernel` brackets: what
    runs inside a launch is not counted."""

    def __init__(self):
        super().__init__()
        self.counts = Counter()
        self.ops = Counter()
        self.inside = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if not self.inside:
            kind = (
                "views"
                if func.is_view or func in ALLOCATIONS or func in NO_TENSOR or is_empty(result)
                else "reads"
                if func in READS
                else "prep"
            )
            self.counts[kind] += 1
            if kind == "prep":
                self.ops[str(func.overloadpacket.__name__)] += 1
                self.counts["prior"] += in_a_prior(sys._getframe())
        return result

    @contextlib.contextmanager
    def kernel(self):
        self.counts["kernels"] += 1
        inside, self.inside = self.inside, True
        try:
            yield
        finally:
            self.inside = inside


def is_empty(result) -> bool:
    """Whether an operation made only tensors without elements (a fold without lanes): on a GPU it
    launches nothing."""
    tensors = [
        t for t in (result if isinstance(result, tuple | list) else (result,)) if isinstance(t, torch.Tensor)
    ]
    return bool(tensors) and all(t.numel() == 0 for t in tensors)


def in_a_prior(frame) -> bool:
    """Whether a frame of the Python stack runs a prior's own code (``priorattn/priors/``): the
    operations of its fold, lag table or grid. Backward operations run from autograd's engine,
    without the prior's frames."""
    while frame is not None:
        if f"{os.sep}priors{os.sep}" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


class Launcher:
    """A Triton kernel whose launches ``count`` counts (:meth:`Count.kernel`) and skips: the
    operations around them do not depend on the values the kernels would write."""

    def __init__(self, count: Count | None):
        self.count = count

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            with self.count.kernel() if self.count else contextlib.nullcontext():
                pass

        return launch


def flex_stand_in(count: Count | None):
    """FlexAttention's compiled kernel as one counted launch returning zeros ``(B, H, Lq, Dv)``."""

    def attend(q, k, v, **kwargs):
        with count.kernel() if count else contextlib.nullcontext():
            return q.new_zeros(*q.shape[:-1], v.shape[-1])

    return lambda: attend


@contextlib.contextmanager
def as_on_cuda(count: Count | None):
    """The routes' choices as on CUDA (no value read back, FlexAttention trains, Triton preferred),
    their kernels counted by ``count`` and skipped."""
    with contextlib.ExitStack() as stack:
        for module in (masks, api, prior_inputs, spans):
            stack.enter_context(mock.patch.object(module, "values_are_free", lambda t: False))
        for module in (api, flex):
            stack.enter_context(mock.patch.object(module, "flex_trains_on", lambda device: True))
        stack.enter_context(mock.patch.object(api, "triton_preferred", lambda device: True))
        stack.enter_context(mock.patch.object(flex, "compiled_flex", flex_stand_in(count)))
        for module, name in KERNELS:
            stack.enter_context(mock.patch.object(module, name, Launcher(count)))
        yield


def auto_on_cuda(prior, L: int, key_bias) -> str:
    """The route ``backend="auto"`` takes on CUDA at ``L`` queries and keys (shapes alone)."""
    q = torch.empty(1, 8, L, 8)
    pos = torch.arange(L)[None]
    with as_on_cuda(None):
        return api._choose(q, q, prior, Masking(True, pos, pos, starts=(0, 0)), key_bias)


def inputs(prior, name: str, L: int, D: int, H: int, gen: torch.Generator):
    Dk = D - prior.fold_width if prior is not None and prior.can_fold(True) else D
    q, k = (torch.randn(1, H, L, Dk, generator=gen).bfloat16().requires_grad_() for _ in range(2))
    v = torch.randn(1, H, L, D, generator=gen).bfloat16().requires_grad_()
    key_bias = fox_key_bias(1, H, L, torch.device("cpu")) if name == FOX else None
    return q, k, v, key_bias, torch.randn(1, H, L, D, generator=gen).bfloat16()


def call(prior, ssmax, route: str, q, k, v, key_bias, grad, backward: bool) -> None:
    """One call, forward (and backward), from no gradients (an optimizer's ``zero_grad``)."""
    for module in (prior, ssmax):
        if module is not None:
            module.zero_grad(set_to_none=True)
    for t in (q, k, v, key_bias):
        if t is not None:
            t.grad = None
    out = priorattn.attention(q, k, v, prior=prior, ssmax=ssmax, key_bias=key_bias, backend=route)
    if backward:
        out.backward(grad)


def counted(prior, ssmax, route: str, args, backward: bool) -> Count:
    """The operations of one call, after a first call that fills the routes' caches."""
    with as_on_cuda(None):
        call(prior, ssmax, route, *args, backward)
    count = Count()
    with as_on_cuda(count), count:
        call(prior, ssmax, route, *args, backward)
    return count


def host_us(prior, ssmax, route: str, args) -> float:
    """CPU microseconds of one forward + backward with the kernels skipped, one thread, median."""
    with as_on_cuda(None):
        run = lambda: call(prior, ssmax, route, *args, True)  # noqa: E731
        run()
        timer = Timer("run()", globals=dict(run=run), num_threads=1)
        return timer.blocked_autorange(min_run_time=0.5).median * 1e6


def takes(prior, route: str) -> bool:
    """Whether ``route`` computes ``prior`` causal at default positions."""
    from priorattn.functional.triton_route import triton_takes

    if route == "triton":
        return triton_takes(prior, Masking(True, torch.arange(2)[None], torch.arange(2)[None], starts=(0, 0)))
    return prior is None or prior.can_fold(True) or prior.is_relative


def measure(host: bool, L: int = 40, D: int = 64, H: int = 8) -> list[dict]:
    rows = []
    for name, (prior, ssmax) in priors(H).items():
        gen = torch.Generator().manual_seed(0)
        args = inputs(prior, name, L, D, H, gen)
        row = dict(prior=name, auto_4k=auto_on_cuda(prior, 4096, args[3]))
        row["auto_16k"] = auto_on_cuda(prior, 16384, args[3])
        for route, passes in (("triton", (False, True)), ("flex", (False,))):
            if not takes(prior, route):
                continue
            for backward in passes:
                count = counted(prior, ssmax, route, args, backward)
                key = f"{route} {'fwd+bwd' if backward else 'fwd'}"
                row[key] = dict(count.counts, ops=dict(count.ops.most_common()))
            if host and route == "triton":
                row["triton host us"] = round(host_us(prior, ssmax, route, args), 1)
        rows.append(row)
        print(f"counted {name}", file=sys.stderr, flush=True)
    return rows


def cell(counts: dict | None) -> str:
    """``prep / kernels / views`` (and ``+Nr``, N host reads)."""
    if counts is None:
        return ""
    reads = f" +{counts['reads']}r" if counts.get("reads") else ""
    return f"{counts.get('prep', 0)} / {counts.get('kernels', 0)} / {counts.get('views', 0)}{reads}"


def launches(counts: dict) -> int:
    return counts.get("prep", 0) + counts.get("kernels", 0)


def compared(counts: dict | None, before: dict | None) -> str:
    """Launches (``prep + kernels``) before and after: ``before -> after``."""
    if counts is None:
        return ""
    return f"{'' if before is None else launches(before)} → {launches(counts)}"


def markdown(rows: list[dict], host: bool, before: list[dict] | None = None) -> str:
    """The table; with ``before`` (rows of an earlier run), launches before and after per cell."""
    earlier = {row["prior"]: row for row in before or ()}
    header = ["prior", "auto on CUDA (4k / 16k)", "triton fwd", "of which the prior's", "triton fwd+bwd"]
    header += ["flex fwd"] + (["triton prep host us (fwd+bwd)"] if host else [])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row["prior"], f"{row['auto_4k']} / {row['auto_16k']}"]
        for key in ("triton fwd", "triton fwd+bwd", "flex fwd"):
            old = earlier.get(row["prior"], {}).get(key)
            cells.append(cell(row.get(key)) if before is None else compared(row.get(key), old))
        forward = row.get("triton fwd")
        cells.insert(3, "" if forward is None else str(forward.get("prior", 0)))
        cells += [str(row.get("triton host us", ""))] if host else []
        lines.append("| " + " | ".join(cells) + " |")
    what = (
        "launches (operations outside the route's kernels that launch a kernel on a GPU, plus the "
        "route's kernels), before → after"
        if before is not None
        else "operations that launch a kernel on a GPU outside the route's kernels / the route's "
        "kernels / views, allocations and empty results (no launch); `+Nr`: host reads of a value"
    )
    note = (
        f"\nEach cell: {what}. Of which the prior's: the forward's operations in the prior's own "
        "methods (`priors/`)."
    )
    return "\n".join(lines) + "\n" + note


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="also write the counts, with each cell's operations by name")
    parser.add_argument("--before", help="a --json FILE of an earlier run: launches before and after")
    parser.add_argument("--host", action="store_true", help="also time the triton route's preparation")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = measure(args.host)
    before = None
    if args.before:
        with open(args.before) as f:
            before = json.load(f)
    print(markdown(rows, args.host, before))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
