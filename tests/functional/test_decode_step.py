"""A decode step as generation runs it, outside autograd: the priors' tiles come from their position
tables, and the CPU flash kernel takes the tile as its mask wherever q, k and v share a width, with
grouped query heads and hidden keys (``sdpa.decode.sdpa_bias_attention``); all against the reference route."""

from __future__ import annotations

import pytest
import torch
from factories import PRIOR_NAMES, make_prior, recording_flash_takes

import priorattn

PRIORS = [name for name in PRIOR_NAMES if name != "uniform"]


def qkv(Lq, Lk, kv_heads, Dk, dtype, seed=3):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, Lq, Dk, generator=gen, dtype=dtype)
    k = torch.randn(2, kv_heads, Lk, Dk, generator=gen, dtype=dtype)
    v = torch.randn(2, kv_heads, Lk, 8, generator=gen, dtype=dtype)
    return q, k, v


@pytest.mark.parametrize("prior_name", PRIORS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("kv_heads, Dk", [(4, 8), (4, 6), (2, 8)])
@pytest.mark.parametrize("Lq, Lk", [(1, 30), (3, 30), (16, 700)])
def test_decode_step_outside_autograd_matches_reference(prior_name, dtype, kv_heads, Dk, Lq, Lk, monkeypatch):
    """Single and multi-token steps, caches short and longer than the kernel's key blocks; grouped
    heads as extra queries of their key/value head; keys narrower than values take the products."""
    took_flash = recording_flash_takes(monkeypatch)
    q, k, v = qkv(Lq, Lk, kv_heads, Dk, dtype)
    prior = make_prior(prior_name, 4, seed=3)
    expected = priorattn.attention(q, k, v, prior=prior, backend="reference")
    with torch.no_grad():
        for _ in range(2):  # the second step reads the tables the first one built
            out = priorattn.attention(q, k, v, prior=prior)
            tol = 1e-12 if dtype == torch.float64 else 1e-5
            torch.testing.assert_close(out, expected.detach(), rtol=tol, atol=tol)
    assert took_flash == [Dk == 8] * 2


@pytest.mark.parametrize("prior_name", ["alibi", "ggd", "goat"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_decode_step_with_hidden_keys_on_the_flash_kernel_matches_reference(
    prior_name, dtype, kv_heads, monkeypatch
):
    """Documents, padding, a window and SSMax: hidden keys enter the kernel's mask as -inf, and a
    query that sees no key at all returns zeros, as on the reference route."""
    took_flash = recording_flash_takes(monkeypatch)
    q, k, v = qkv(3, 40, kv_heads, 8, dtype)
    doc_ids = torch.zeros(2, 40, dtype=torch.long)
    doc_ids[0, 30:] = 1
    doc_ids[1, 37:] = torch.tensor([1, 2, 3])  # the last query of row 1 is alone in its document ...
    padding = torch.zeros(2, 40, dtype=torch.bool)
    padding[0, :5] = True
    padding[1, 39] = True  # ... and its only key is padding: it sees nothing
    options = dict(
        prior=make_prior(prior_name, 4, seed=5), window=9, doc_ids=doc_ids, key_padding_mask=padding
    )
    options["ssmax"] = torch.tensor([0.5, 1.0, 1.5, 2.0], dtype=dtype)
    expected = priorattn.attention(q, k, v, backend="reference", **options)
    with torch.no_grad():
        out = priorattn.attention(q, k, v, **options)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(out, expected.detach(), rtol=tol, atol=tol)
    assert torch.equal(out[1, :, 2], torch.zeros_like(out[1, :, 2])) and took_flash == [True]
