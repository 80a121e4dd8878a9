"""Bad input gets a clear error naming the problem."""

from __future__ import annotations

import pytest
import torch

import priorattn
from priorattn.priors import GGD, GOAT, ALiBi

q = torch.randn(1, 4, 5, 8)
kv = torch.randn(1, 2, 5, 8)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (
            dict(k=torch.randn(1, 3, 5, 8), v=torch.randn(1, 3, 5, 8)),
            ValueError,
            "k has 3 heads but q has 4",
        ),
        (dict(k=torch.randn(1, 2, 5, 6)), ValueError, "head width 8 but k has 6"),
        (dict(v=torch.randn(1, 2, 4, 8)), ValueError, "must agree on"),
        (dict(q=torch.randn(4, 5, 8)), ValueError, "q must be a 4-D tensor"),
        (dict(q=q.double()), TypeError, "share a dtype"),
        (dict(q_pos=torch.arange(5.0)), ValueError, "q_pos must be an integer tensor"),
        (dict(k_pos=torch.arange(4)), ValueError, r"k_pos must have shape \(5,\)"),
        (dict(prior=ALiBi(3)), ValueError, "prior has 3 heads but q has 4"),
        (dict(prior=GGD(4), backend="sdpa"), ValueError, "GGD does not"),
        (dict(prior=GOAT(4, 2), causal=False, backend="sdpa"), ValueError, "without a causal mask"),
        (dict(backend="flash"), ValueError, "backend must be one of"),
        (dict(window=0), ValueError, "window must be a positive int"),
        (dict(ssmax=torch.ones(3)), ValueError, r"one scale per query head \(4,\)"),
        (dict(key_padding_mask=torch.zeros(1, 5)), ValueError, "key_padding_mask must be a bool"),
        (
            dict(doc_ids=torch.zeros(1, 4, dtype=torch.long)),
            ValueError,
            "must be an integer tensor",
        ),
        (dict(prior="alibi"), TypeError, "prior must be a priorattn.priors.Prior"),
    ],
)
def test_bad_input_names_the_problem(kwargs, error, message):
    args = dict(q=q, k=kv, v=kv)
    args.update(kwargs)
    with pytest.raises(error, match=message):
        priorattn.attention(args.pop("q"), args.pop("k"), args.pop("v"), **args)


def test_defaults_put_queries_at_the_end_of_the_keys():
    """With Lq < Lk the queries are the newest keys: a decode step equals the full pass's tail."""
    x = torch.randn(1, 2, 9, 8)
    full = priorattn.attention(x, x, x, prior=ALiBi(2))
    tail = priorattn.attention(x[:, :, -3:], x, x, prior=ALiBi(2))
    assert torch.allclose(full[:, :, -3:], tail, atol=1e-6)


def test_one_document_per_row_is_no_mask():
    """Doc ids that never change along a row mask nothing, so they are dropped (the mask-free kernels
    stay in use); rows that cross a boundary keep them."""
    from priorattn.functional.api import _doc_ids

    one_doc = torch.tensor([[3, 3, 3, 3], [7, 7, 7, 7]])
    assert _doc_ids(one_doc, 2, 4, 4) == (None, None)
    crossing = torch.tensor([[3, 3, 4, 4], [7, 7, 7, 7]])
    q_doc, k_doc = _doc_ids(crossing, 2, 2, 4)
    assert torch.equal(q_doc, crossing[:, 2:]) and torch.equal(k_doc, crossing)
    x = torch.randn(2, 2, 4, 8)
    expected = priorattn.attention(x, x, x, prior=ALiBi(2), backend="reference")
    assert torch.allclose(priorattn.attention(x, x, x, prior=ALiBi(2), doc_ids=one_doc), expected, atol=1e-6)


def test_the_op_and_its_subpackage_are_both_importable():
    """``priorattn.attention`` is the function; the routes live in ``priorattn.functional``, so
    importing a route module does not collide with the function's name (issue 14)."""
    import importlib

    for name in ("api", "masks", "reference", "sdpa", "memeff", "flex", "prior_inputs", "grouped"):
        module = importlib.import_module(f"priorattn.functional.{name}")
        assert module.__name__ == f"priorattn.functional.{name}"
    import priorattn.functional.api

    assert priorattn.attention is priorattn.functional.api.attention
    assert callable(priorattn.attention)


def test_a_subnormal_alibi_slope_folds_like_a_zero_slope():
    """Found by tests/theory: 2^8 / 2.2e-309 overflowed when the sdpa route sized its slope runs."""
    q64, k64 = (torch.randn(1, 2, 6, 4, dtype=torch.float64) for _ in range(2))
    prior = ALiBi(2, slopes=torch.tensor([2.2e-309, 0.5], dtype=torch.float64))
    out = priorattn.attention(q64, k64, k64, prior=prior, backend="sdpa")
    ref = priorattn.attention(q64, k64, k64, prior=prior, backend="reference")
    torch.testing.assert_close(out, ref)
