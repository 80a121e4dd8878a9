"""FoX's forget-gate gradient in float32 on each route, against the float64 reference route.

A ``PriorMultiheadAttention(64, 4, num_kv_heads=2, forget_gate=True)`` (PyTorch's default
initialisation, seed 0) whose gate bias is set to each ``--gate-biases`` value (-1: ``F`` falls to
about -2700 nats over 2000 tokens, -4: about -8000), one sequence of ``--length`` random inputs, the
loss ``sum(y * w)`` for a fixed random ``w``. For each route: ``max |grad - exact|`` of the gate's
bias and of its weight, ``exact`` the same layer in float64 on the reference route (the definition).
``F``'s reverse cumulative sum back to ``log f`` adds up every later row's rounding, so these
errors show how exactly a route's rows of the logits' gradient sum to zero.

    PYTHONPATH=src python benchmarks/fox_gradient.py
    PYTHONPATH=src python benchmarks/fox_gradient.py --length 4000 --gate-biases -2
"""

from __future__ import annotations

import argparse
import copy

import torch

from priorattn.layers import PriorMultiheadAttention

ROUTES = ("reference", "memeff", "sdpa")


def gate_gradients(
    module: PriorMultiheadAttention, x: torch.Tensor, w: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """The gradients of the gate's bias and weight (float64) of the loss ``sum(module(x) * w)``."""
    module.zero_grad()
    (module(x)[0] * w).sum().backward()
    return tuple(p.grad.double() for p in (module.forget_gate.proj.bias, module.forget_gate.proj.weight))


def fox_problem(gate_bias: float, length: int) -> tuple[PriorMultiheadAttention, torch.Tensor, torch.Tensor]:
    """The float32 layer with its gate bias set to ``gate_bias``, inputs ``x`` and the loss's ``w``."""
    torch.manual_seed(0)
    module = PriorMultiheadAttention(64, 4, num_kv_heads=2, forget_gate=True)
    with torch.no_grad():
        module.forget_gate.proj.bias.fill_(gate_bias)
    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(2, 1, length, 64, generator=gen)
    return module, x, w


def gate_gradient_errors(
    gate_bias: float, routes=ROUTES, length: int = 2000
) -> dict[str, tuple[float, float]]:
    """``{route: (bias error, weight error)}``: ``max |grad - exact|`` of the float32 layer on each
    route, ``exact`` from the float64 reference route."""
    module, x, w = fox_problem(gate_bias, length)
    in_float64 = copy.deepcopy(module).double()
    in_float64.backend = "reference"
    exact = gate_gradients(in_float64, x.double(), w.double())
    errors = {}
    for route in routes:
        module.backend = route
        grads = gate_gradients(module, x, w)
        errors[route] = tuple((grad - truth).abs().max().item() for grad, truth in zip(grads, exact))
    return errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=2000)
    parser.add_argument("--gate-biases", type=float, nargs="+", default=[-1.0, -4.0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print("| gate bias | lowest F | route | gate bias's gradient: max error | gate weight's: max error |")
    print("|---:|---:|---|---:|---:|")
    for gate_bias in args.gate_biases:
        module, x, _ = fox_problem(gate_bias, args.length)
        lowest = module.forget_gate.cumulative(x, None, None).min().item()
        for route, (bias, weight) in gate_gradient_errors(gate_bias, length=args.length).items():
            print(f"| {gate_bias:g} | {lowest:.0f} | {route} | {bias:.2e} | {weight:.2e} |")


if __name__ == "__main__":
    main()
