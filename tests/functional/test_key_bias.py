"""The op's per-key additive term ``key_bias``: its checks, its gradient, the route ``auto`` picks,
and its precision when it drifts far (FoX's ``-F_j``). Every route against the reference over
shapes, dtypes, masks, documents and GQA: ``test_routes.py`` (its problems draw a key bias)."""

from __future__ import annotations

import pytest
import torch
from factories import make_prior
from test_routes import TOLERANCE, assert_close

import priorattn
from priorattn.functional import api, prior_inputs
from priorattn.priors import ALiBi


def drift(B, H, L, strength, gen):
    """``-F_j``, minus the cumulative sum of log forget gates ``(B, H, L)`` in float64: gates near
    ``sigmoid(-strength)`` forget about ``strength`` nats per key."""
    logits = torch.randn(B, H, L, generator=gen, dtype=torch.float64) - strength
    return -torch.nn.functional.logsigmoid(logits).cumsum(-1)


@pytest.mark.parametrize(
    "key_bias, error, match",
    [
        (torch.zeros(2, 2, 6, dtype=torch.long), TypeError, "key_bias must be a floating point tensor"),
        ([0.0] * 6, TypeError, "key_bias must be a floating point tensor"),
        (torch.zeros(2, 2, 5), ValueError, r"key_bias must broadcast to \(B, H, Lk\) = \(2, 2, 6\)"),
        (torch.zeros(3, 2, 6), ValueError, "key_bias must broadcast"),
        (torch.zeros(1, 2, 2, 6), ValueError, "key_bias must broadcast"),
        (torch.zeros(2, 6, 1), ValueError, "key_bias must broadcast"),
    ],
)
def test_key_bias_is_checked_with_a_message_naming_it(key_bias, error, match):
    q, k = torch.randn(2, 2, 6, 4), torch.randn(2, 1, 6, 4)
    with pytest.raises(error, match=match):
        priorattn.attention(q, k, k, key_bias=key_bias)


def test_non_finite_key_bias_is_refused_when_values_are_checked():
    q = torch.randn(1, 2, 6, 4)
    key_bias = torch.zeros(6).index_fill_(0, torch.tensor([2]), -torch.inf)
    priorattn.checks.set_value_checks(True)
    try:
        with pytest.raises(ValueError, match="key_bias has non-finite values"):
            priorattn.attention(q, q, q, key_bias=key_bias)
    finally:
        priorattn.checks.set_value_checks(False)


@pytest.mark.parametrize("shape", [(6,), (2, 6), (1, 2, 6), (2, 1, 6)])
def test_broadcast_key_bias_equals_the_full_one(shape):
    q, k = torch.randn(2, 2, 6, 4, dtype=torch.float64), torch.randn(2, 1, 6, 4, dtype=torch.float64)
    key_bias = torch.randn(shape, dtype=torch.float64)
    full = key_bias.reshape((1,) * (3 - len(shape)) + shape).expand(2, 2, 6)
    for backend in ("reference", "sdpa", "memeff"):
        out = priorattn.attention(q, k, k, key_bias=key_bias, backend=backend)
        ref = priorattn.attention(q, k, k, key_bias=full.contiguous(), backend="reference")
        assert_close(out, ref, TOLERANCE[torch.float64], f"{backend} with key_bias {shape}")


def test_key_bias_adds_to_each_row_of_logits():
    """Written out: softmax_j(scale q.k + u_j) v, against the op."""
    q, k, v = (torch.randn(1, 1, 5, 3, dtype=torch.float64) for _ in range(3))
    u = torch.randn(5, dtype=torch.float64)
    logits = (q @ k.transpose(-1, -2)) / 3**0.5 + u
    logits = logits.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), -torch.inf)
    expected = torch.softmax(logits, -1) @ v
    for backend in ("reference", "sdpa", "memeff"):
        assert_close(priorattn.attention(q, k, v, key_bias=u, backend=backend), expected, 1e-12, backend)


@pytest.mark.parametrize("backend", ["reference", "sdpa", "memeff", "auto"])
@pytest.mark.parametrize("docs", [False, True])
def test_gradcheck_key_bias(backend, docs):
    """Gradients of q, k, v and the key bias in float64 (``auto``: a decode step's tile route)."""
    gen = torch.Generator().manual_seed(0)
    Lq = 2 if backend == "auto" else 6
    q = torch.randn(1, 2, Lq, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(1, 1, 6, 4, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(2))
    key_bias = drift(1, 2, 6, 1.0, gen).requires_grad_()
    doc_ids = torch.tensor([[0, 0, 1, 1, 1, 1]]) if docs else None

    def attend(q, k, v, key_bias):
        return priorattn.attention(
            q, k, v, key_bias=key_bias, doc_ids=doc_ids, prior=ALiBi(2).double(), backend=backend
        )

    assert torch.autograd.gradcheck(attend, (q, k, v, key_bias))


def test_auto_folds_a_key_bias_and_takes_the_tile_in_a_decode_step(monkeypatch):
    chosen = []
    monkeypatch.setitem(api.ROUTES, "sdpa", lambda *a: chosen.append("sdpa"))
    monkeypatch.setitem(api.ROUTES, "memeff", lambda *a: chosen.append("memeff"))
    monkeypatch.setattr(api, "sdpa_bias_attention", lambda *a: chosen.append(api.DECODE_ROUTE))
    step, cache = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 300, 8)
    key_bias = 100 * torch.randn(1, 2, 300)  # a steep drift: still one lane, in short runs
    priorattn.attention(cache, cache, cache, key_bias=key_bias)
    priorattn.attention(step, cache, cache, key_bias=key_bias)
    assert chosen == ["sdpa", api.DECODE_ROUTE]


def test_key_bias_drift_sizes_runs_as_a_slope():
    """A drift of m per key takes runs of SLOPE_MAGNITUDE / m queries, as a slope m does."""
    key_bias = 0.5 * torch.arange(1000.0).expand(2, 3, 1000)
    rate = prior_inputs.key_bias_drift(key_bias)
    assert torch.allclose(rate, torch.full((3,), 0.5))
    assert prior_inputs.slope_span(float(rate.max()), torch.float32) == 2**8 * 2


@pytest.mark.parametrize("backend", ["sdpa", "memeff"])
def test_far_drifting_key_bias_stays_precise_in_float32(backend):
    """FoX with strong forgetting: ``-F_j`` climbs to ~1e4 over 4096 keys. A float32 logit of that
    size keeps ~1e-3 absolute; centred per run of queries, the routes stay at float32's own error
    against the float64 reference (as does the float32 reference only where nothing drifts)."""
    gen = torch.Generator().manual_seed(0)
    L = 4096
    q, k, v = (torch.randn(1, 2, L, 16, generator=gen, dtype=torch.float64) for _ in range(3))
    key_bias = drift(1, 2, L, 2.0, gen)
    assert key_bias.max() > 8000
    ref = priorattn.attention(q, k, v, key_bias=key_bias, backend="reference")
    out = priorattn.attention(q.float(), k.float(), v.float(), key_bias=key_bias, backend=backend)
    assert_close(out, ref, TOLERANCE[torch.float32], f"{backend} with a drift to 1e4")
    uncentred = priorattn.attention(
        q.float(), k.float(), v.float(), key_bias=key_bias.float(), backend="reference"
    )
    assert (uncentred.double() - ref).abs().max() > 10 * (out.double() - ref).abs().max()


def test_fox_at_16k_with_strong_forgetting_stays_precise_via_sdpa():
    """``-F_j`` of 16384 strongly forgetting gates reaches ~3e4. sdpa in float32 against the float64
    blockwise route (the dense float64 reference would hold 2 GB of logits; ``memeff`` is tested
    against it in ``test_routes.py``)."""
    gen = torch.Generator().manual_seed(0)
    L = 16384
    q, k, v = (torch.randn(1, 1, L, 16, generator=gen, dtype=torch.float64) for _ in range(3))
    key_bias = drift(1, 1, L, 2.0, gen)
    assert key_bias.max() > 2e4
    ref = priorattn.attention(q, k, v, key_bias=key_bias, backend="memeff")
    out = priorattn.attention(q.float(), k.float(), v.float(), key_bias=key_bias, backend="sdpa")
    assert_close(out, ref, TOLERANCE[torch.float32], "sdpa at L = 16384")


def test_a_prior_query_gate_scales_the_key_bias_with_the_log_prior():
    """GOAT's gate multiplies query i's whole log-prior, the op's key bias included:
    ``softmax_j(scale q.k + g(q_i) (K_ij + u_j))``, written out, on every route (``auto``: a decode
    step's tile)."""
    gen = torch.Generator().manual_seed(0)
    prior = make_prior("goat_gate", 2, seed=1)
    q, k, v = (torch.randn(1, 2, 6, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    u = drift(1, 2, 6, 1.0, gen)
    pos = torch.arange(6)
    gate = prior.query_gate(q)  # (1, 2, 6, 1)
    logits = (q @ k.transpose(-1, -2)) / 2 + gate * (prior.log_prior(pos, pos) + u[..., None, :])
    logits = logits.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), -torch.inf)
    expected = torch.softmax(logits, -1) @ v
    for backend in ("reference", "sdpa", "memeff"):
        out = priorattn.attention(q, k, v, prior=prior, key_bias=u, backend=backend)
        assert_close(out, expected, TOLERANCE[torch.float64], backend)
    step = priorattn.attention(q[:, :, -1:], k, v, prior=prior, key_bias=u, q_pos=pos[-1:], k_pos=pos)
    assert_close(step, expected[:, :, -1:], TOLERANCE[torch.float64], "decode step")
