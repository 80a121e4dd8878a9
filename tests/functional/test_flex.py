"""The FlexAttention route (forward only on the CPU) against the reference route."""

from __future__ import annotations

import pytest
import torch
from factories import make_prior

import priorattn
from priorattn.priors import GGD

CASES = {
    "alibi, causal": ("alibi", dict()),
    "ggd (lag table), decode offsets": (
        "ggd_negative",
        dict(q_pos=torch.arange(100, 140), k_pos=torch.arange(40, 140)),
    ),
    "goat, ssmax, docs, window": ("goat", dict(ssmax=torch.tensor([0.6, 1.4]), window=30, docs=True)),
    "goat without slope, bidirectional, padding": ("goat_noslope", dict(causal=False, padding=True)),
}


@pytest.mark.parametrize("case", CASES)
def test_flex_matches_reference(case):
    name, kwargs = CASES[case]
    gen = torch.Generator().manual_seed(0)
    Lq = kwargs["q_pos"].shape[0] if "q_pos" in kwargs else 100
    q = torch.randn(2, 2, Lq, 8, generator=gen)
    k, v = (torch.randn(2, 1, 100, 8, generator=gen) for _ in range(2))
    kwargs = dict(kwargs)
    if kwargs.pop("docs", False):
        kwargs["doc_ids"] = torch.randint(0, 3, (2, 100), generator=gen).sort(-1).values
    if kwargs.pop("padding", False):
        kwargs["key_padding_mask"] = torch.rand(2, 100, generator=gen) < 0.2
    prior = make_prior(name, 2, dtype=torch.float32)
    with torch.no_grad():
        out = priorattn.attention(q, k, v, prior=prior, backend="flex", **kwargs)
        ref = priorattn.attention(
            q.double(), k.double(), v.double(), prior=prior.double(), backend="reference", **kwargs
        )
    assert (out.double() - ref).abs().max() < 1e-5


def test_flex_refuses_gradients_with_a_clear_error():
    q = torch.randn(1, 2, 8, 4, requires_grad=True)
    with pytest.raises(RuntimeError, match="forward only"):
        priorattn.attention(q, q, q, prior=GGD(2), backend="flex")


def test_flex_refuses_priors_it_cannot_express():
    x = torch.randn(1, 2, 8, 4)
    with torch.no_grad(), pytest.raises(ValueError, match="backend='flex' needs"):
        priorattn.attention(
            x, x, x, prior=GGD(2), q_pos=torch.tensor([[0, 2, 4, 6, 8, 10, 12, 14]]), backend="flex"
        )
