"""Graph breaks of ``torch.compile`` for one PriorMultiheadAttention layer per prior (forward).

    .venv/bin/python benchmarks/graph_breaks.py

Prints, per prior and route, the number of graphs and breaks ``torch._dynamo.explain`` finds for a
causal layer (B 2, L 64, d_model 64, 4 heads) at default positions, with and without document ids,
and the function each break happens in.
"""

from __future__ import annotations

import collections
import logging

import torch
import torch._dynamo

import priorattn
from priorattn.priors import GGD, GOAT, ALiBi, Sum, Uniform, build_prior

PRIORS = {
    "none": (lambda: None, "auto"),
    "uniform": (Uniform, "auto"),
    "goat (no slope)": (lambda: GOAT(4, 3, slope=False), "auto"),
    "goat": (lambda: GOAT(4, 3, init="alibi"), "auto"),
    "alibi": (lambda: ALiBi(4), "auto"),
    "alibi + goat (no slope)": (lambda: Sum(ALiBi(4), GOAT(4, 2, slope=False)), "auto"),
    "ggd": (lambda: GGD(4, init="alibi"), "auto"),
    "goat + ssmax": (lambda: GOAT(4, 3, init="alibi"), "auto"),
    "goat (no slope) via memeff": (lambda: GOAT(4, 3, slope=False), "memeff"),
    **{
        name: (lambda name=name: build_prior(name, 4), "auto")
        for name in ("t5", "kerple", "sandwich", "fire")
    },
    "fox": (lambda: None, "auto"),  # FoX's forget gate: the op's key bias, no prior
}


def where(reason) -> str:
    frames = [f for f in reason.user_stack if "priorattn" in f.filename]
    return frames[-1].name if frames else reason.user_stack[-1].name


def main() -> None:
    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)
    torch.manual_seed(0)
    x = torch.randn(2, 64, 64)
    docs = torch.arange(64).div(20, rounding_mode="floor").expand(2, 64)
    print("| prior | route | graphs / breaks | with doc_ids | breaks in |")
    print("|---|---|---:|---:|---|")
    for name, (make, backend) in PRIORS.items():
        ssmax = name.endswith("ssmax")
        layer = priorattn.PriorMultiheadAttention(
            64, 4, prior=make(), backend=backend, ssmax=ssmax, forget_gate=name == "fox"
        )
        counts = []
        places = collections.Counter()
        for kwargs in ({}, {"doc_ids": docs}):
            torch._dynamo.reset()
            explained = torch._dynamo.explain(layer)(x, **kwargs)
            counts.append(f"{explained.graph_count} / {explained.graph_break_count}")
            places.update(where(r) for r in explained.break_reasons)
        spots = ", ".join(f"{place} ({n})" for place, n in places.items()) or "-"
        print(f"| {name} | {backend} | {counts[0]} | {counts[1]} | {spots} |")


if __name__ == "__main__":
    main()
