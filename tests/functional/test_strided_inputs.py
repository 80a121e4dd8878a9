"""Routes take q, k, v as a layer makes them: transposed views of ``(B, L, H, D)`` projections.

A route that accumulates gradients into a buffer with the inputs' strides and then reshapes it can
sum into a copy and lose the sums (memeff's table backward did, for every batch of more than one
sequence: a GPT with GGD trained with wrong key and value gradients). Every route and prior is
compared with the reference on such views, forward and backward.
"""

from __future__ import annotations

import pytest
import torch
from factories import PRIOR_NAMES, make_prior

import priorattn

ROUTES = ("auto", "sdpa", "memeff")


def projected(B: int, L: int, H: int, D: int, seed: int) -> torch.Tensor:
    """One ``(B, L, 3, H, D)`` projection whose q, k, v slices are views with a layer's strides."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(B, L, 3, H, D, generator=gen, dtype=torch.float64).requires_grad_()


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("prior_name", PRIOR_NAMES)
@pytest.mark.parametrize("B, L", [(3, 37), (2, 130)])
def test_routes_match_the_reference_on_transposed_views(route, prior_name, B, L):
    H, D = 2, 16
    prior = make_prior(prior_name, H)
    if route == "sdpa" and not prior.can_fold(True):
        pytest.skip(f"{prior_name} does not fold")
    base = projected(B, L, H, D, seed=B + L)
    grad_out = torch.randn(B, H, L, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    results = []
    for backend in (route, "reference"):
        base.grad = None
        prior.zero_grad()
        q, k, v = (t.transpose(1, 2) for t in base.unbind(2))  # (B, H, L, D) views, not contiguous
        out = priorattn.attention(q, k, v, prior=prior, backend=backend)
        out.backward(grad_out)
        results.append((out.detach(), base.grad.clone(), [p.grad.clone() for p in prior.parameters()]))
    (out, grad, prior_grads), (ref_out, ref_grad, ref_prior_grads) = results
    torch.testing.assert_close(out, ref_out, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-9, atol=1e-9)  # dq, dk, dv together
    for got, want in zip(prior_grads, ref_prior_grads):
        torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-9)
