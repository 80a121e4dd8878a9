"""The FlexAttention route (forward only on the CPU) against the reference route, and when ``auto``
takes it."""

from __future__ import annotations

import pytest
import torch
from factories import DEVICES, make_prior
from test_key_bias import drift

import priorattn
from priorattn.functional import api, flex
from priorattn.priors import GGD, GOAT, ALiBi

CASES = {
    "alibi, causal": ("alibi", dict()),
    "ggd (lag table), decode offsets": (
        "ggd_negative",
        dict(q_pos=torch.arange(100, 140), k_pos=torch.arange(40, 140)),
    ),
    "goat, ssmax, docs, window": ("goat", dict(ssmax=torch.tensor([0.6, 1.4]), window=30, docs=True)),
    "goat without slope, bidirectional, padding": ("goat_noslope", dict(causal=False, padding=True)),
    "ggd (lag table) and a drifting key bias, docs": (
        "ggd_negative",
        dict(key_bias=torch.linspace(0, 30, 100).expand(2, 2, 100) + torch.randn(2, 2, 100), docs=True),
    ),
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


def test_flex_trains_on_cuda_only():
    assert flex.flex_trains_on(torch.device("cuda"))
    assert not flex.flex_trains_on(torch.device("cpu"))


def choice(q, prior, **kwargs) -> str:
    """The route ``auto`` takes for ``attention(q, q, q, prior=prior, **kwargs)``."""
    chosen = []
    with pytest.MonkeyPatch.context() as patch:
        for name in api.ROUTES:
            patch.setitem(api.ROUTES, name, lambda *a, name=name: chosen.append(name))
        priorattn.attention(q, q, q, prior=prior, **kwargs)
    return chosen[0]


def test_auto_chooses_flex_for_a_prior_that_does_not_fold_where_flex_trains(monkeypatch):
    """The device check is a seam: on a CUDA device (faked here) GGD, which cannot fold, takes flex,
    and so does a fold whose slope splits the queries into runs (ALiBi at 4096, GOAT's default); a
    fold without a slope, or whose slope fits one run, keeps SDPA, and a prior flex cannot read (no
    lag table) keeps memeff."""
    q = torch.randn(1, 2, 300, 8)
    assert choice(q, GGD(2)) == "memeff"  # the CPU: flex has no backward
    assert choice(q, ALiBi(2)) == "sdpa"
    monkeypatch.setattr(api, "flex_trains_on", lambda device: True)
    monkeypatch.setattr(api, "largest_slope", lambda slope, bound: bound)  # a GPU reads no slope
    assert choice(q, GGD(2)) == "flex"
    assert choice(q, ALiBi(2)) == "sdpa"  # its slope fits one run of 300 queries: one flash call
    assert choice(torch.randn(1, 8, 1024, 8), ALiBi(8)) == "flex"  # slopes to 1/2: runs of 512
    assert choice(q, GOAT(2, 2)) == "flex"  # GOAT's bound of 1 takes runs of 256 float32 queries
    assert choice(q, GOAT(2, 2, slope=False)) == "sdpa"
    assert choice(q, None) == "sdpa"
    gaps = torch.arange(0, 600, 2)  # positions that are no run: no lag table, flex cannot read GGD
    assert choice(q, GGD(2), q_pos=gaps, k_pos=gaps) == "memeff"
    assert choice(q, GGD(2), ssmax=torch.ones(2), window=40) == "flex"
    key_bias = torch.randn(1, 2, 300)  # FoX's -F_j: on CUDA flex centres it per row, reading nothing
    assert choice(q, None, key_bias=key_bias) == "flex"
    assert choice(q, GOAT(2, 2, slope=False), key_bias=key_bias) == "flex"
    assert choice(q, GGD(2), key_bias=key_bias) == "flex"


def test_row_centred_key_bias_is_the_key_bias_up_to_a_row_constant_with_its_gradient():
    """``(hi_j - hi_t) + (lo_j - lo_t)`` is ``u_j - u_t`` to float32's precision of the difference
    (not of ``u``), ``t`` the row's own key; the gradient reaches ``u`` through ``hi_j`` alone."""
    gen = torch.Generator().manual_seed(0)
    u = drift(1, 2, 300, 3.0, gen).requires_grad_()  # climbs past 900
    hi, (row_hi, lo, row_lo) = flex.row_centred_key_bias(u, 100, torch.float32)
    centred = (hi[..., None, :] - row_hi[..., :, None]) + (lo[..., None, :] - row_lo[..., :, None])
    exact = u.detach()[..., None, :] - u.detach()[..., 200:, None]  # rows are keys 200..299
    near = exact.abs() < 1
    assert u.detach().max() > 900 and near.sum() > 100
    assert (centred.double() - exact)[near].abs().max() < 1e-7  # float32 rounding of u itself: ~6e-5
    assert (u.detach().float().double() - u.detach()).abs().max() > 1e-5
    weights = torch.randn(1, 2, 100, 300, dtype=torch.float64)
    (centred.double() * weights).sum().backward()
    torch.testing.assert_close(u.grad, weights.sum(2), rtol=1e-5, atol=1e-5)  # float32; rows carry none
    assert not (lo.requires_grad or row_hi.requires_grad or row_lo.requires_grad)
    same = torch.randn(1, 2, 5)
    assert flex.row_centred_key_bias(same, 5, torch.float32)[1].rounding is None


@pytest.mark.parametrize("device", DEVICES)
def test_flex_keeps_float32_precision_for_a_far_drifting_key_bias(device):
    """FoX's ``-F_j`` climbing past 5000 over 2048 keys, float32 q, k, v, against the float64
    reference: within float32's tolerance, where the same bias added once in float32 (the reference
    in float32) is far off. Forward on the CPU; on CUDA the key bias's gradient too."""
    gen = torch.Generator().manual_seed(0)
    L = 2048
    q, k, v = (torch.randn(1, 2, L, 16, generator=gen, dtype=torch.float64) for _ in range(3))
    key_bias = drift(1, 2, L, 2.5, gen).requires_grad_()
    assert key_bias.max() > 5000
    grad = torch.randn(1, 2, L, 16, generator=gen, dtype=torch.float64)
    ref = priorattn.attention(q, k, v, key_bias=key_bias, backend="reference")
    (expected_grad,) = torch.autograd.grad(ref, key_bias, grad)
    q32, k32, v32 = (t.float().to(device) for t in (q, k, v))
    with torch.set_grad_enabled(device == "cuda"):
        out = priorattn.attention(q32, k32, v32, key_bias=key_bias.to(device), backend="flex")
        plain = priorattn.attention(q32, k32, v32, key_bias=key_bias.float().to(device), backend="reference")
    error = (out.double().cpu() - ref).abs().max()
    assert error < 1e-4
    assert (plain.double().cpu() - ref).abs().max() > 10 * error
    if device == "cuda":
        (got,) = torch.autograd.grad(out, key_bias, grad.float().to(device))
        torch.testing.assert_close(got.cpu(), expected_grad, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("with_bias", [True, False])
def test_a_slope_gradient_carried_by_a_key_bias_is_the_slope_gradient(causal, with_bias):
    """flex's score_mod reads the slope without its gradient and a zero key bias ``m j - m j`` that
    carries it; under the softmax over keys that is the gradient of ``-m (i - j)`` exactly."""
    torch.manual_seed(0)
    B, H, L = 2, 3, 9
    scores = torch.randn(B, H, L, L, dtype=torch.float64)
    values = torch.randn(B, H, L, 4, dtype=torch.float64)
    pos = torch.arange(100, 100 + L).expand(B, L)  # far from 0: the key term is large
    lag = (pos[:, None, :, None] - pos[:, None, None, :]).double()  # (B, 1, L, L): i - j
    hidden = torch.ones(L, L, dtype=torch.bool).triu(1) if causal else torch.zeros(L, L, dtype=torch.bool)
    bias = torch.randn(B, H, L, dtype=torch.float64, requires_grad=True) if with_bias else None

    def loss(slope_term, key_term):
        logits = (scores + slope_term + key_term).masked_fill(hidden, float("-inf"))
        return (torch.softmax(logits, -1) @ values).square().sum()

    def key_term_of(b):
        return 0.0 if b is None else b[:, :, None, :]

    slope = torch.rand(H, dtype=torch.float64, requires_grad=True)
    expected = torch.autograd.grad(loss(-slope[:, None, None] * lag, key_term_of(bias)), slope)[0]
    detached, carried = flex.slope_gradient_as_key_bias(slope, pos, bias)
    assert not detached.requires_grad and torch.equal(detached, slope.detach())
    assert torch.equal(
        carried.detach(), torch.zeros(B, H, L, dtype=torch.float64) if bias is None else bias.detach()
    )
    got = torch.autograd.grad(loss(-detached[:, None, None] * lag, key_term_of(carried)), slope)[0]
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    fixed = torch.rand(H)
    assert flex.slope_gradient_as_key_bias(fixed, pos, None) == (fixed, None)


def test_flex_pads_narrow_heads_with_zero_lanes():
    x = torch.randn(1, 2, 5, 6)
    padded = flex.pad_width(x, flex.MIN_HEAD_DIM)
    assert (
        padded.shape[-1] == flex.MIN_HEAD_DIM
        and torch.equal(padded[..., :6], x)
        and not padded[..., 6:].any()
    )
    assert flex.pad_width(padded, flex.MIN_HEAD_DIM) is padded
