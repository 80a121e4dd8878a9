"""A half-precision slope lane stays in half precision while its key offsets are exact integers."""

from __future__ import annotations

import pytest
import torch

import priorattn
from priorattn.functional import prior_inputs
from priorattn.functional.masks import Masking
from priorattn.functional.sdpa import flash
from priorattn.priors import GOAT, ALiBi
from priorattn.priors.math import inverse_softplus


def kernel_dtypes(monkeypatch) -> set[torch.dtype]:
    """The dtypes of the queries the SDPA route hands its CPU flash kernel (forward and backward),
    recorded while the test runs."""
    seen = set()
    flash_inputs = flash.flash_inputs

    def spy(*args):
        q2, k2, v2 = flash_inputs(*args)
        seen.add(q2.dtype)
        return q2, k2, v2

    monkeypatch.setattr(flash, "flash_inputs", spy)
    return seen


def run(prior, L, dtype, start=0):
    gen = torch.Generator().manual_seed(L)
    q, k, v = (torch.randn(1, 4, L, 16, generator=gen, dtype=torch.float64) for _ in range(3))
    rounded = [t.to(dtype).double() for t in (q, k, v)]  # the reference sees the same inputs
    pos = torch.arange(start, start + L)
    ref = priorattn.attention(*rounded, prior=prior.double(), q_pos=pos, k_pos=pos, backend="reference")
    half = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    out = priorattn.attention(*half, prior=prior.float(), q_pos=pos, k_pos=pos, backend="sdpa")
    out.float().sum().backward()
    assert out.dtype == dtype and all(t.grad.dtype == dtype for t in half)
    return (out.double() - ref).abs().max().item()


@pytest.mark.parametrize("start", [0, 1_000_000])
def test_bfloat16_alibi_over_256_positions_stays_bfloat16_with_the_error_of_no_prior(start, monkeypatch):
    """Offsets up to 2^8 are exact in bfloat16 and the kernel sums logits in float32: the slope adds
    no rounding of its own, so the error is that of plain bfloat16 attention on the same inputs."""
    seen = kernel_dtypes(monkeypatch)
    error = run(ALiBi(4), 257, torch.bfloat16, start)  # positions spread over 256
    assert seen == {torch.bfloat16}
    gen = torch.Generator().manual_seed(257)
    q, k, v = (torch.randn(1, 4, 257, 16, generator=gen, dtype=torch.float64).bfloat16() for _ in range(3))
    plain = priorattn.attention(q, k, v).double() - priorattn.attention(*(t.double() for t in (q, k, v)))
    assert error <= 3 * plain.abs().max().item()  # measured: 1.8x, both from rounding the output


def test_bfloat16_slope_over_more_positions_computes_in_float32(monkeypatch):
    seen = kernel_dtypes(monkeypatch)
    error = run(ALiBi(4), 258, torch.bfloat16)  # an offset of 257 would round
    assert seen == {torch.float32}
    assert error <= 2**-8


def test_learned_bfloat16_slope_rounds_once(monkeypatch):
    """A GOAT slope that bfloat16 cannot hold is rounded once in the lane, as every other lane."""
    seen = kernel_dtypes(monkeypatch)
    prior = GOAT(4, 2)
    with torch.no_grad():
        prior.slope_raw.copy_(inverse_softplus(torch.tensor([0.3, 0.11, 0.017, 0.0051])))
    assert run(prior, 200, torch.bfloat16) <= 2**-6
    assert seen == {torch.bfloat16}


def masking(q_pos, k_pos, starts=None):
    return Masking(True, q_pos, k_pos, starts=starts)


def test_position_spread_of_runs_general_positions_and_unreadable_ones(monkeypatch):
    assert prior_inputs.position_spread(masking(torch.arange(5, 9)[None], torch.arange(10)[None])) == 9
    # a run known without reading it: a decode step at 300 over 301 keys
    assert prior_inputs.position_spread(masking(torch.zeros(1, 1), torch.zeros(1, 301), (300, 0))) == 300
    batched = torch.tensor([[0, 1, 2], [40, 41, 42]])
    assert prior_inputs.position_spread(masking(batched, batched)) == 42
    monkeypatch.setattr(prior_inputs, "values_are_free", lambda t: False)  # on a GPU, under compile
    assert prior_inputs.position_spread(masking(batched, batched)) is None
    assert prior_inputs.slope_precision(torch.bfloat16, masking(batched, batched)) == torch.bfloat16


@pytest.mark.parametrize("dtype, exact", [(torch.bfloat16, 256), (torch.float16, 2048)])
def test_slope_precision_is_float32_while_offsets_are_exact(dtype, exact):
    def precision(n):
        return prior_inputs.slope_precision(dtype, masking(torch.arange(n)[None], torch.arange(n)[None]))

    assert precision(exact + 1) == torch.float32 and precision(exact + 2) == dtype
    assert prior_inputs.slope_precision(
        torch.float32, masking(torch.arange(3)[None], torch.arange(3)[None])
    ) == (torch.float32)
