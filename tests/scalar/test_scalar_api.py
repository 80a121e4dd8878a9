"""scalar_attention at its boundary: bad input gets a clear error; the folded call is one SDPA call."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import priorattn
from priorattn.functional.sdpa import flash
from priorattn.priors import GOAT
from priorattn.scalar import ScalarMultiheadAttention, Temperature, scalar_attention
from priorattn.scalar.temperature import TAU_FLOOR


def inputs(B=1, H=4, G=2, L=5, D=3):
    return torch.randn(B, H, L), torch.randn(B, H, L), torch.randn(B, G, L, D)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(tau=0.0), "tau must be finite and > 0"),
        (dict(tau=-1.0), "tau must be finite and > 0"),
        (dict(tau=torch.ones(3)), r"tau must have shape \(\), \(4,\) or \(1, 4, 5\)"),
        (dict(v=torch.randn(1, 3, 5, 3)), "v has 3 value groups but there are 4 heads: G must divide H"),
        (dict(k_s=torch.randn(1, 4)), r"k_s must be a tensor \(B, H, Lk\)"),
        (dict(q=torch.randn(1, 4, 5, 2)), "q and k come together"),
        (dict(q=torch.randn(1, 4, 5, 2), k=torch.randn(1, 4, 5, 2)), r"k must be \(B, G, Lk, Dk\)"),
        (dict(sink_value=torch.zeros(4, 3)), r"sink_value must be a \(2, 3\) tensor"),
        (dict(sink_value=torch.zeros(2, 3), window=2), "a sink has no position"),
        (dict(backend="fast"), "backend must be one of"),
    ],
)
def test_bad_input_is_named(change, message):
    q_s, k_s, v = inputs()
    call = dict(q_s=q_s, k_s=k_s, v=v, tau=0.5) | change
    with pytest.raises(ValueError, match=message):
        scalar_attention(**call)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(tau=torch.tensor([1.0, 1.0, float("nan"), 1.0])), "tau must be finite and > 0"),
        (dict(k_s=torch.tensor(float("nan")).expand(1, 4, 5)), "k_s has non-finite values"),
        (dict(q_s=torch.full((1, 4, 5), float("inf"))), "q_s has non-finite values"),
    ],
)
def test_bad_values_are_named_when_value_checks_are_on(change, message):
    """Values are read (a host sync per call) only under priorattn.set_value_checks(True), as in
    priorattn.attention; by default the call runs (its output is then undefined)."""
    q_s, k_s, v = inputs()
    call = dict(q_s=q_s, k_s=k_s, v=v, tau=0.5) | change
    scalar_attention(**call)
    priorattn.set_value_checks(True)
    try:
        with pytest.raises(ValueError, match=message):
            scalar_attention(**call)
    finally:
        priorattn.set_value_checks(False)


def test_goat_and_the_scalar_term_run_as_one_sdpa_call(monkeypatch):
    """seed 002 experiment 6: GOAT's lanes and the scalar lanes in one unmodified SDPA call."""
    calls = []
    real = flash.flash_inputs  # a prior's calls reach the CPU flash kernel through it

    def counted(*args):
        q2, k2, v2 = real(*args)
        calls.append(q2.shape)
        return q2, k2, v2

    monkeypatch.setattr(flash, "flash_inputs", counted)
    q_s, k_s, v = inputs(L=64, D=16)
    q, k = torch.randn(1, 4, 64, 8), torch.randn(1, 2, 64, 8)
    scalar_attention(q_s, k_s, v, 0.5, q=q, k=k, prior=GOAT(4, 3), backend="sdpa")
    # 8 content lanes + 2 scalar lanes per head of a group (m = 2) + GOAT: 2R = 6, sink 1, slope 1
    assert calls == [torch.Size([1, 4, 64, 8 + 4 + 8])]


def test_pure_scalar_heads_reach_sdpa_with_one_head_width(monkeypatch):
    """2 scalar lanes against 16-wide values would send SDPA to its math path (L x L weights):
    the lanes are widened with zeros to the value width."""
    widths = []
    real = F.scaled_dot_product_attention

    def counted(q, k, v, **kwargs):
        widths.append((q.shape[-1], k.shape[-1], v.shape[-1]))
        return real(q, k, v, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counted)
    q_s, k_s, v = inputs(L=64, D=16)
    scalar_attention(q_s, k_s, v, 0.5, backend="sdpa")
    assert widths == [(16, 16, 16)]


def test_align_on_a_long_sequence_uses_no_dense_route(monkeypatch):
    """L_align (and the forward) at L = 2048 run through the folded SDPA route: the dense definitions
    that build L x L logits are never called."""
    import priorattn.functional.api as api
    import priorattn.scalar.functional as functional

    def dense(*args, **kwargs):
        raise AssertionError("an L x L route was called")

    monkeypatch.setattr(functional, "scalar_reference", dense)
    monkeypatch.setitem(api.ROUTES, "reference", dense)
    monkeypatch.setitem(api.ROUTES, "memeff", dense)
    layer = ScalarMultiheadAttention(32, 4, value_groups=2, hybrid=True, sink=True)
    layer.track = ("align", "spread", "tau")
    doc_ids = (torch.arange(2048) >= 1000).long()[None]
    y, _ = layer(torch.randn(1, 2048, 32), doc_ids=doc_ids)
    (y.sum() + sum(layer.terms.values())).backward()
    assert layer.q_proj.weight.grad is not None


@pytest.mark.parametrize("kind, shape", [("global", ()), ("head", (3,)), ("token", (2, 3, 5))])
def test_temperature_starts_at_init_and_stays_under_its_cap(kind, shape):
    x = torch.randn(2, 5, 8)
    tau = Temperature(3, kind, init=0.2, d_model=8)
    assert tau(x).shape == shape
    torch.testing.assert_close(tau(x), torch.full(shape, 0.2))
    capped = Temperature(3, kind, init=0.2, cap=0.5, d_model=8)
    torch.testing.assert_close(capped(x), torch.full(shape, 0.2))
    with torch.no_grad():  # the raw value (per token: the bias) far above, then far below zero
        (capped.raw if kind != "token" else capped.proj.bias).add_(100.0)
        (tau.raw if kind != "token" else tau.proj.bias).sub_(300.0)
    assert bool((capped(x) <= 0.5).all()) and bool((capped(x) > 0.49).all())
    assert bool((tau(x) >= TAU_FLOOR).all())  # where softplus alone underflows to 0
