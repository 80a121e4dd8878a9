"""The seed 002 regularizer terms of trained scalar/hybrid runs, on 8 x 256 validation tokens.

For each run directory: the unweighted ``L_align``, ``L_spread`` (range (-3, 3)) and ``L_tau``
averaged over the model's scalar layers, and the mean and largest learned tau.

    python benchmarks/scalar_terms.py runs/hybrid runs/hybrid-reg
"""

from __future__ import annotations

import sys

import torch

from priorattn.data import run_documents
from priorattn.scalar import ScalarMultiheadAttention
from priorattn.train import load_run

TERMS = ("align", "spread", "tau")


def main(paths: list[str]) -> None:
    print("| run | L_align | L_spread | L_tau | mean tau | max tau |")
    print("|---|---:|---:|---:|---:|---:|")
    for path in paths:
        run = load_run(path)
        text = "".join(doc.read() for doc in run_documents(path))
        tokens = torch.tensor(run.tokenizer.encode(text)[: 8 * 256]).view(8, 256)
        layers = [m for m in run.model.modules() if isinstance(m, ScalarMultiheadAttention)]
        run.model.train()  # the layers compute their terms in training mode (these runs have no dropout)
        for layer in layers:
            layer.track = TERMS
        with torch.no_grad():
            run.model(tokens)
        terms = [sum(float(layer.terms[name]) for layer in layers) / len(layers) for name in TERMS]
        tau = torch.cat([layer.temperature().detach().flatten() for layer in layers])
        cells = [f"{value:.4f}" for value in (*terms, float(tau.mean()), float(tau.max()))]
        print(f"| {path} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
