"""A decode step as generation runs it, outside autograd: the priors' tiles come from their position
tables, and the CPU flash kernel takes the tile where heads and widths agree
(``sdpa.sdpa_bias_attention``); both against the reference route."""

from __future__ import annotations

import pytest
import torch
from factories import PRIOR_NAMES, make_prior

import priorattn
from priorattn.functional import sdpa


@pytest.mark.parametrize("prior_name", [name for name in PRIOR_NAMES if name != "uniform"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("kv_heads, Dk", [(4, 8), (4, 6), (2, 8)])
def test_decode_step_outside_autograd_matches_reference(prior_name, dtype, kv_heads, Dk, monkeypatch):
    took_flash = []
    takes = sdpa.flash_takes
    monkeypatch.setattr(sdpa, "flash_takes", lambda *a: took_flash.append(takes(*a)) or took_flash[-1])
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 1, Dk, generator=gen, dtype=dtype)
    k = torch.randn(2, kv_heads, 30, Dk, generator=gen, dtype=dtype)
    v = torch.randn(2, kv_heads, 30, 8, generator=gen, dtype=dtype)
    prior = make_prior(prior_name, 4, seed=3)
    expected = priorattn.attention(q, k, v, prior=prior, backend="reference")
    with torch.no_grad():
        for _ in range(2):  # the second step reads the tables the first one built
            out = priorattn.attention(q, k, v, prior=prior)
            tol = 1e-12 if dtype == torch.float64 else 1e-5
            torch.testing.assert_close(out, expected.detach(), rtol=tol, atol=tol)
    assert took_flash == [kv_heads == 4 and Dk == 8] * 2
