"""Every route equals the reference route, forward and backward, over shapes, dtypes and masks."""

from __future__ import annotations

import copy
import math

import factories
import pytest
import torch
from factories import DEVICES, make_prior
from hypothesis import given, settings
from hypothesis import strategies as st

import priorattn
from priorattn.functional import memeff, prior_inputs
from priorattn.functional.sdpa import decode, flash, planning, route
from priorattn.priors import GGD, ALiBi

TOLERANCE = {torch.float64: 1e-9, torch.float32: 2e-5, torch.bfloat16: 4e-2}
#: bfloat16 keeps 8 significant bits: one rounding moves a value by at most 2^-8 of itself.
BF16_ROUNDOFF = 2.0**-8
#: How many roundings of a route in bfloat16 the comparison allows (see ``bf16_scales``).
#: memeff's general blocks compute in float32 and round only at the route's boundary: its output,
#: the output gradient entering it and the gradients it returns; its flash path (``lag_flash``) also
#: hands bfloat16 to the kernel's forward: the scaled q and the weights before P @ V. sdpa also
#: rounds the folded lanes and each position's lane gradient before the prior's parameters sum them.
#: Measured: errors up to 0.23 (memeff) and 1.53 (sdpa) of these units over 3000 random problems,
#: and no failure at max_examples=800 with --hypothesis-seed 1, 2 and 3; since the flash path
#: hands bfloat16 to the kernel, up to 1.2 on its own problems (``test_lag_flash.lag_problems``,
#: runs of 1000-3000; docs/performance_log.md, fifth session).
BF16_ULPS = {"memeff": 2, "sdpa": 8, "sdpa_bias": 2, "flex": 2}  # sdpa_bias, flex compute in float32


@st.composite
def problems(draw):
    """A random attention call: shapes, GQA, positions, masks, prior, SSMax."""
    B = draw(st.integers(1, 2))
    Hkv = draw(st.integers(1, 2))
    H = Hkv * draw(st.sampled_from([1, 2]))
    Lk = draw(st.integers(1, 40))
    Lq = draw(st.integers(1, Lk))
    causal = draw(st.booleans())
    offset = draw(st.sampled_from([0, 0, 3, 1000]))
    options = dict(
        B=B,
        H=H,
        Hkv=Hkv,
        Lq=Lq,
        Lk=Lk,
        Dk=draw(st.sampled_from([4, 8])),
        Dv=draw(st.sampled_from([4, 6])),
        causal=causal,
        offset=offset,
        prior=draw(st.sampled_from(factories.PRIOR_NAMES)),  # read here: see tests/factories.py
        seed=draw(st.integers(0, 2**16)),
        window=draw(st.sampled_from([None, None, 1, 5])),
        docs=draw(st.booleans()),
        padding=draw(st.booleans()),
        ssmax=draw(st.booleans()),
        batched_pos=draw(st.booleans()),
        key_bias=draw(st.sampled_from([None, None, "noise", "drift"])),
        key_bias_shape=draw(st.sampled_from(["full", "heads", "keys"])),
    )
    return options


def make_key_bias(o, dtype, gen):
    """The op's ``key_bias``: noise in ``dtype``, or a drift in float64 as FoX hands it (minus the
    cumulative sum of log forget gates, restarting nowhere), shaped ``(B, H, Lk)``, ``(1, H, Lk)`` or
    ``(Lk,)``; None when the problem has none."""
    kind, Lk = o.get("key_bias"), o["Lk"]
    if kind is None:
        return None
    shape = {"full": (o["B"], o["H"], Lk), "heads": (1, o["H"], Lk), "keys": (Lk,)}[o["key_bias_shape"]]
    if kind == "noise":
        return (2 * torch.randn(shape, generator=gen, dtype=torch.float64)).to(dtype)
    log_f = torch.nn.functional.logsigmoid(2 * torch.randn(shape, generator=gen, dtype=torch.float64))
    return -log_f.cumsum(-1)


def build(o, dtype):
    gen = torch.Generator().manual_seed(o["seed"])
    q = torch.randn(o["B"], o["H"], o["Lq"], o["Dk"], generator=gen, dtype=torch.float64)
    k = torch.randn(o["B"], o["Hkv"], o["Lk"], o["Dk"], generator=gen, dtype=torch.float64)
    v = torch.randn(o["B"], o["Hkv"], o["Lk"], o["Dv"], generator=gen, dtype=torch.float64)
    kwargs = dict(causal=o["causal"], window=o["window"])
    Lq, Lk, off = o["Lq"], o["Lk"], o["offset"]
    if off or o["batched_pos"]:
        shift = (
            torch.tensor([[0], [7]])[: o["B"]] if o["batched_pos"] else torch.zeros(1, 1, dtype=torch.long)
        )
        k_pos = off + torch.arange(Lk)[None] + shift
        kwargs.update(k_pos=k_pos, q_pos=k_pos[:, Lk - Lq :])
    if o["docs"]:
        kwargs["doc_ids"] = torch.randint(0, 3, (o["B"], Lk), generator=gen).sort(-1).values
    if o["padding"]:
        kwargs["key_padding_mask"] = torch.rand(o["B"], Lk, generator=gen) < 0.2
    prior = make_prior(o["prior"], o["H"], o["seed"])
    ssmax = (torch.rand(o["H"], generator=gen, dtype=torch.float64) + 0.5) if o["ssmax"] else None
    key_bias = make_key_bias(o, dtype, gen)
    if key_bias is not None:
        kwargs["key_bias"] = key_bias
    return [t.to(dtype) for t in (q, k, v)], prior, ssmax, kwargs


def run(backend, q, k, v, prior, ssmax, kwargs):
    """Output and the gradients of a random projection of it w.r.t. everything learnable.

    ``backend="sdpa_bias"`` is ``auto`` on a call it must send to the decode route. A ``key_bias`` in
    ``kwargs`` is learnable too (its gradient comes last)."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    s = None if ssmax is None else ssmax.detach().clone().requires_grad_()
    kwargs = dict(kwargs)
    key_bias = kwargs.pop("key_bias", None)
    key_bias = [] if key_bias is None else [key_bias.detach().clone().requires_grad_()]
    if backend == "sdpa_bias":
        assert decode.is_decode_step(q, k)
        backend = "auto"
    out = priorattn.attention(
        *leaves, prior=prior, ssmax=s, backend=backend, key_bias=(key_bias or [None])[0], **kwargs
    )
    weights = torch.linspace(-1, 1, out.numel(), dtype=torch.float64, device=out.device).view_as(out)
    params = [p for p in prior.parameters() if p.requires_grad]
    inputs = leaves + params + ([s] if s is not None else []) + key_bias
    grads = torch.autograd.grad((out.double() * weights).sum(), inputs, allow_unused=True)
    grads = [torch.zeros_like(x) if g is None else g for x, g in zip(inputs, grads)]
    return out, grads


def assert_close(actual, expected, tol, what, floor=1.0):
    scale = expected.abs().max().item() + floor
    err = (actual.double() - expected.double()).abs().max().item()
    assert err <= tol * scale, f"{what}: max error {err:.3g} > {tol:g} x {scale:.3g}"


class LogPrior(torch.nn.Module):
    """``prior.log_prior`` as a forward pass, so that ``torch.func`` can differentiate it by parameter."""

    def __init__(self, prior):
        super().__init__()
        self.prior = prior

    def forward(self, q_pos, k_pos):
        return self.prior.log_prior(q_pos, k_pos)


def bf16_scales(o, q, k, v, prior, ssmax, kwargs):
    """``condition`` and a ``floor`` for the output and each gradient of ``run``: a bfloat16 route may
    miss by ``ulps * BF16_ROUNDOFF * condition * (max |expected| + floor)``.

    Rounding a logit l moves it by up to 2^-8 |l|, and moving the logits by d moves the weights by up
    to d relatively: ``condition = 1 + max |l|`` (``|l| <= boost (|scale q.k| + |K|)``, ``boost``
    bounding SSMax's factor). An output or gradient sums contributions through the derivative of the
    logits by its entries; where they cancel, the sum is smaller than they are, and the largest
    derivative bounds them: the floor (|v| for the output, |k| and |q| for dq and dk, 1 for dv,
    max |dK / d theta| for a prior parameter, log Lk |l| for an SSMax scale).
    """
    Lk, scale = o["Lk"], o["Dk"] ** -0.5
    k_pos = kwargs.get("k_pos", torch.arange(Lk)[None])
    q_pos = kwargs.get("q_pos", k_pos[:, Lk - o["Lq"] :])
    keys = k.double().repeat_interleave(o["H"] // o["Hkv"], dim=1)
    content = (scale * q.double() @ keys.transpose(-1, -2)).abs().max().item()
    log_prior = prior.log_prior(q_pos, k_pos).abs().max().item()
    key_bias = kwargs.get("key_bias")
    if key_bias is not None:  # routes centre it on each run's keys: its spread bounds what it adds
        log_prior += (key_bias.amax(-1) - key_bias.amin(-1)).abs().max().item()
    boost = 1.0 if ssmax is None else max(1.0, ssmax.max().item() * math.log(Lk))
    logit = boost * (content + log_prior)
    floors = [v.abs().max().item(), boost * scale * k.abs().max().item()]
    floors += [boost * scale * q.abs().max().item(), 1.0]
    params = {f"prior.{n}": p.detach() for n, p in prior.named_parameters() if p.requires_grad}
    if params:
        evaluate = LogPrior(prior)
        jacobian = torch.func.jacfwd(lambda ps: torch.func.functional_call(evaluate, ps, (q_pos, k_pos)))(
            params
        )
        # The query gate g(q_i) = sigmoid(b - softplus(s) ||q_i||) multiplies the whole log-prior and
        # is no part of it: d logit / d b <= |K| / 4, d logit / d s <= |K| ||q|| / 4.
        gate = log_prior * max(1.0, q.double().norm(dim=-1).max().item()) / 4
        floors += [
            boost * (gate if n.startswith("prior.gate_") else jacobian[n].abs().max().item()) for n in params
        ]
    if ssmax is not None:
        floors.append(math.log(Lk) * (content + log_prior))
    if key_bias is not None:  # d out_i / d u_j = p_ij (v_j - out_i)
        floors.append(boost * 2 * v.abs().max().item())
    return 1.0 + logit, floors


def on_device(device, q, k, v, prior, ssmax, kwargs):
    """The same problem on ``device``; the reference it is compared with stays on the CPU."""
    kwargs = {n: x.to(device) if isinstance(x, torch.Tensor) else x for n, x in kwargs.items()}
    ssmax = None if ssmax is None else ssmax.to(device)
    return q.to(device), k.to(device), v.to(device), copy.deepcopy(prior).to(device), ssmax, kwargs


def check_route(backend, o, dtype, device="cpu"):
    (q, k, v), prior, ssmax, kwargs = build(o, dtype)
    if backend == "sdpa" and not prior.can_fold(o["causal"]):
        with pytest.raises(ValueError, match="folds into q/k lanes"):
            priorattn.attention(q, k, v, prior=prior, backend="sdpa", **kwargs)
        return
    # The definition, in float64 from the same (possibly rounded) inputs.
    ref_out, ref_grads = run("reference", *(t.double() for t in (q, k, v)), prior, ssmax, kwargs)
    out, grads = run(backend, *on_device(device, q, k, v, prior, ssmax, kwargs))
    out, grads = out.cpu(), [g.cpu() for g in grads]
    assert out.dtype == dtype and out.shape == ref_out.shape
    assert torch.isfinite(out).all()
    if dtype == torch.bfloat16:
        condition, floors = bf16_scales(o, q, k, v, prior, ssmax, kwargs)
        tol = BF16_ULPS[backend] * BF16_ROUNDOFF * condition
        for i, (x, r, floor) in enumerate(zip([out, *grads], [ref_out, *ref_grads], floors, strict=True)):
            assert_close(x, r, tol, "output" if i == 0 else f"gradient {i - 1}", floor)
        return
    tol = TOLERANCE[dtype]
    assert_close(out, ref_out, tol, "output")
    for i, (g, r) in enumerate(zip(grads, ref_grads)):
        assert_close(g, r, 20 * tol, f"gradient {i}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["sdpa", "memeff"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@settings(max_examples=40, deadline=None)
@given(o=problems())
def test_route_matches_reference(backend, dtype, device, o):
    check_route(backend, o, dtype, device)


#: Problems the flex route can express on CUDA, where positions are not read back: default
#: positions, so a relative prior that does not fold (GGD) is read from its lag table.
FLEX_CASES = {
    "ggd, docs, ssmax": dict(prior="ggd", docs=True, ssmax=True),
    "ggd_negative, window, gqa": dict(prior="ggd_negative", window=5, Hkv=1),
    "goat, padding": dict(prior="goat", padding=True),
    "goat_noslope, bidirectional": dict(prior="goat_noslope", causal=False),
}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available (never run here)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", FLEX_CASES)
def test_flex_route_trains_on_cuda_and_matches_reference(case, dtype):
    """On CUDA FlexAttention has a backward and ``auto`` takes it for GGD: forward and gradients
    against the float64 reference, as every route."""
    o = dict(B=2, H=2, Hkv=2, Lq=40, Lk=40, Dk=8, Dv=8, causal=True, offset=0, seed=0, window=None)
    o.update(docs=False, padding=False, ssmax=False, batched_pos=False)
    check_route("flex", {**o, **FLEX_CASES[case]}, dtype, "cuda")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@settings(max_examples=40, deadline=None)
@given(o=problems(), key_block=st.integers(1, 7), slope_runs=st.booleans())
def test_sdpa_route_in_small_key_blocks_and_slope_runs_matches_reference(dtype, o, key_block, slope_runs):
    """The CPU route's calls take their keys in blocks of ``KEY_BLOCK``, merged by log-sum-exp in
    the forward and each with the kernel's own backward; shrunk here so that most calls have
    several blocks (and, with ``slope_runs``, slopes re-centred every few queries)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(flash, "KEY_BLOCK", key_block)
        if slope_runs:
            for low in (torch.float64, torch.float32):  # runs of 2^3 / |slope| queries
                patch.setitem(prior_inputs.SLOPE_MAGNITUDE, low, 2.0**3)
        check_route("sdpa", o, dtype)


@st.composite
def decode_steps(draw):
    """A random call of ``problems`` cut to a decode step: a few queries against a longer cache."""
    o = draw(problems())
    Lk = max(o["Lk"], 2)
    prior = draw(st.sampled_from([name for name in factories.PRIOR_NAMES if name != "uniform"]))
    return {**o, "Lk": Lk, "Lq": draw(st.integers(1, min(4, Lk - 1))), "prior": prior}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@settings(max_examples=40, deadline=None)
@given(o=decode_steps())
def test_decode_step_takes_the_bias_tile_route_and_matches_reference(dtype, device, o):
    check_route("sdpa_bias", o, dtype, device)


def test_auto_takes_the_bias_tile_route_only_for_a_prior_in_a_decode_step(monkeypatch):
    from priorattn.functional import api

    chosen = []
    for name in ("sdpa", "memeff"):
        monkeypatch.setitem(api.ROUTES, name, lambda *a, name=name: chosen.append(name))
    monkeypatch.setattr(api, "sdpa_bias_attention", lambda *a: chosen.append(api.DECODE_ROUTE))
    step, cache = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 300, 8)
    priorattn.attention(step, cache, cache, prior=GGD(2))
    priorattn.attention(step, cache, cache, prior=ALiBi(2))
    priorattn.attention(step, cache, cache)  # no prior: no tile to add
    priorattn.attention(cache, cache, cache, prior=ALiBi(2))  # a full pass folds
    many = torch.randn(1, 2, decode.DECODE_QUERIES + 1, 8)
    priorattn.attention(many, cache, cache, prior=GGD(2))
    assert chosen == [api.DECODE_ROUTE, api.DECODE_ROUTE, "sdpa", "sdpa", "memeff"]


@pytest.mark.parametrize("docs", [True, False])
@pytest.mark.parametrize("prior", ["alibi", "ggd_negative", "goat", "sum"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_memeff_many_blocks_matches_reference(prior, dtype, docs, monkeypatch):
    monkeypatch.setattr(memeff, "MIN_ROWS", 16)
    monkeypatch.setattr(memeff, "MAX_ROWS", 16)
    o = dict(
        B=2,
        H=4,
        Hkv=2,
        Lq=70,
        Lk=90,
        Dk=8,
        Dv=8,
        causal=True,
        offset=5,
        prior=prior,
        seed=1,
        window=None,
        docs=docs,
        padding=False,
        ssmax=True,
        batched_pos=False,
    )
    check_route("memeff", o, dtype)


def test_route_on_the_reference_itself_is_float64_definition():
    o = dict(
        B=1,
        H=2,
        Hkv=1,
        Lq=9,
        Lk=12,
        Dk=4,
        Dv=4,
        causal=True,
        offset=0,
        prior="goat",
        seed=0,
        window=3,
        docs=False,
        padding=True,
        ssmax=True,
        batched_pos=False,
    )
    check_route("reference", o, torch.float32)


@pytest.mark.parametrize("backend", ["reference", "sdpa", "memeff"])
def test_query_with_no_visible_key_returns_zeros(backend):
    q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    pad = torch.tensor([[True, True, True, False, False, False]])
    # Query 0 sits at position 2 and sees keys 0..2, all padding.
    out = priorattn.attention(q.requires_grad_(), k, v, prior=ALiBi(2), key_padding_mask=pad, backend=backend)
    assert torch.equal(out[:, :, 0], torch.zeros(1, 2, 8))
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert torch.isfinite(q.grad).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_alibi_fold_stays_exact_at_long_positions(dtype):
    """Key-linear lanes grow with the position; the SDPA route re-centres them per query run."""
    L, offset = 2048, 1_000_000
    q, k, v = (torch.randn(1, 8, L, 32, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(offset, offset + L)
    kwargs = dict(prior=ALiBi(8).double(), q_pos=pos, k_pos=pos)
    ref = priorattn.attention(q, k, v, backend="reference", **kwargs)
    kwargs["prior"] = ALiBi(8)
    out = priorattn.attention(*(t.to(dtype) for t in (q, k, v)), backend="sdpa", **kwargs)
    assert_close(out, ref, TOLERANCE[dtype], "ALiBi via SDPA at position 1e6")


@pytest.mark.parametrize("start", [-16, -10_000_016, 10_000_000])
def test_negative_and_very_large_positions_are_finite_and_exact(prior_name, start):
    """Positions before 0 (GOAT's sink once gave NaN there) and near 1e7, on every route."""
    pos = torch.arange(start, start + 16)
    q, k, v = (torch.randn(1, 2, 16, 8, dtype=torch.float64) for _ in range(3))
    prior = make_prior(prior_name, 2)
    ref = priorattn.attention(q, k, v, prior=prior, q_pos=pos, k_pos=pos, backend="reference")
    assert torch.isfinite(ref).all()
    routes = ["sdpa", "memeff"] if prior.can_fold(causal=True) else ["memeff"]
    for backend in routes:
        out = priorattn.attention(q, k, v, prior=prior, q_pos=pos, k_pos=pos, backend=backend)
        assert_close(out, ref, TOLERANCE[torch.float64], f"{backend} at positions from {start}")
    # float32 stays finite; far from 0 its error grows with the sink's length-normalised inputs
    float_prior = make_prior(prior_name, 2, dtype=torch.float32)
    for backend in ["reference", *routes]:
        out = priorattn.attention(
            q.float(), k.float(), v.float(), prior=float_prior, q_pos=pos, k_pos=pos, backend=backend
        )
        assert torch.isfinite(out).all(), f"{backend} in float32 at positions from {start}"


def test_auto_never_builds_a_dense_bias_for_ggd(monkeypatch):
    from priorattn.functional import api

    calls = []
    monkeypatch.setitem(api.ROUTES, "reference", lambda *a: calls.append("reference"))
    monkeypatch.setitem(api.ROUTES, "memeff", lambda *a: calls.append("memeff"))
    q = torch.randn(1, 2, 300, 8)
    priorattn.attention(q, q, q, prior=GGD(2))
    assert calls == ["memeff"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_slope_folds_in_float32(dtype, monkeypatch):
    """A bfloat16 slope lane would allow runs of ~1/m queries; the SDPA route computes in float32
    instead, so auto keeps it, and output and gradients come back in the input dtype."""
    from priorattn.functional import api

    chosen = []
    monkeypatch.setitem(api.ROUTES, "memeff", lambda *a: chosen.append("memeff"))
    q, k, v = (torch.randn(2, 8, 300, 16, dtype=torch.float64) for _ in range(3))
    ref = priorattn.attention(q, k, v, prior=ALiBi(8).double(), backend="reference")
    half = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    out = priorattn.attention(*half, prior=ALiBi(8))
    assert chosen == [] and out.dtype == dtype
    assert_close(out, ref, TOLERANCE[torch.bfloat16], "half-precision ALiBi via SDPA")
    out.float().sum().backward()
    assert all(t.grad.dtype == dtype and torch.isfinite(t.grad).all() for t in half)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "L, one_key", [(1, {}), (24, {"window": 1}), (24, {"doc_ids": torch.arange(24).expand(4, 24)})]
)
def test_memeff_logit_gradient_is_zero_when_each_query_sees_one_key(L, one_key, dtype):
    """A query with one visible key puts weight exactly 1 on it whatever its logit, so the logits and
    the prior's parameters get no gradient. GGD with theta_beta < 0 and mu near the lag 0 has a steep
    bias (d b / d theta_mu ~ -1e4 here) that turns any rounding residual of the softmax backward into
    a visible gradient (issue 8: -3.2e-3 for theta_mu at Lq = Lk = 1, theta_beta = -0.84)."""
    prior = GGD(2, init="alibi", trainable=("alpha", "beta", "mu")).to(dtype)
    with torch.no_grad():
        prior.theta_beta.fill_(-0.84)
        prior.theta_mu.copy_(torch.tensor([-1e-3, 2e-3]))
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(4, 2, L, 8, generator=gen).to(dtype).requires_grad_() for _ in range(2))
    v = torch.randn(4, 2, L, 6, generator=gen).to(dtype).requires_grad_()
    out = priorattn.attention(q, k, v, prior=prior, backend="memeff", **one_key)
    grad_out = torch.randn(out.shape, generator=gen).to(dtype)
    out.backward(grad_out)
    assert torch.equal(out, v)
    assert torch.equal(v.grad, grad_out)
    for name, leaf in [*prior.named_parameters(), ("q", q), ("k", k)]:
        assert not leaf.grad.any(), f"{name} has gradient up to {leaf.grad.abs().max():.3g}, expected 0"


LONG = dict(B=2, H=4, Hkv=2, Lq=300, Lk=300, Dk=8, Dv=8, causal=True, offset=0, seed=3, window=None)
LONG.update(docs=True, padding=False, ssmax=False, batched_pos=False)
#: Masks at lengths that cross every chunking threshold: several documents per row (rows of the
#: batch with different boundaries), several windowed bands, and (thresholds lowered in
#: ``low_thresholds``) masked bands split by their cell cap, re-centred slope runs, memeff blocks.
LONG_CASES = {
    "docs": {},
    "docs-prefill": dict(Lq=220),
    "docs-noncausal": dict(causal=False),
    "docs-window": dict(window=30),
    "docs-padding-ssmax": dict(padding=True, ssmax=True),
    "docs-ssmax-positions": dict(ssmax=True, batched_pos=True, offset=1000),
    "docs-window-noncausal": dict(causal=False, window=70),
    "window": dict(docs=False, window=40),
    "window-noncausal": dict(docs=False, causal=False, window=70),
    "window-prefill-ssmax": dict(docs=False, Lq=200, window=40, ssmax=True),
}


@pytest.fixture
def low_thresholds(monkeypatch):
    monkeypatch.setattr(planning, "MASK_CHUNK_CELLS", 1 << 12)
    monkeypatch.setattr(flash, "KEY_BLOCK", 48)
    monkeypatch.setattr(memeff, "MAX_ROWS", 64)
    for dtype in (torch.float64, torch.float32):  # slope runs of 2^6 / 0.5 = 128 queries
        monkeypatch.setitem(prior_inputs.SLOPE_MAGNITUDE, dtype, 2.0**6)


@pytest.mark.parametrize("case", LONG_CASES)
@pytest.mark.parametrize("prior", ["alibi", "goat", "ggd"])
@pytest.mark.parametrize("backend", ["sdpa", "memeff"])
def test_long_masked_route_matches_reference(backend, prior, case, low_thresholds):
    o = {**LONG, **LONG_CASES[case], "prior": prior}
    if not o["causal"] and prior != "ggd":
        o["prior"] = "goat_noslope"  # folds without a causal mask
    if backend == "sdpa" and prior == "ggd":
        o["prior"] = "sum"  # ALiBi + GOAT: every fold lane at once
    check_route(backend, o, torch.float64)


@pytest.mark.parametrize("compiling", [False, True])
@pytest.mark.parametrize("case", ["docs", "docs-prefill", "window-prefill-ssmax"])
def test_sdpa_route_with_the_public_lower_right_kernel_matches_reference(
    case, compiling, low_thresholds, monkeypatch
):
    """The kernel other devices use (public SDPA and torch's bottom-right causal bias, or a boolean
    mask where ``torch.compile`` traces it), run here."""
    monkeypatch.setattr(route, "lower_right_kernel", lambda device: route.public_lower_right_causal)
    monkeypatch.setattr(route, "folded_calls_kernel", lambda device: route.autograd_calls)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: compiling)
    check_route("sdpa", {**LONG, **LONG_CASES[case], "prior": "goat"}, torch.float64)


@pytest.mark.parametrize("backend", ["sdpa", "memeff"])
def test_keys_out_of_position_order_take_dense_masks(backend):
    """Key positions that are not sorted have no key spans: the routes fall back to dense masks."""
    L = 300
    q, k, v = (torch.randn(2, 2, L, 8, dtype=torch.float64) for _ in range(3))
    k_pos = torch.randperm(L)
    docs = torch.randint(0, 3, (2, L))
    kwargs = dict(prior=ALiBi(2).double(), k_pos=k_pos, q_pos=k_pos, doc_ids=docs, window=40)
    ref = priorattn.attention(q, k, v, backend="reference", **kwargs)
    assert_close(priorattn.attention(q, k, v, backend=backend, **kwargs), ref, 1e-9, backend)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("prior", ["alibi", "goat", "sum"])
@pytest.mark.parametrize("backend", ["sdpa", "memeff"])
def test_slope_runs_sized_by_the_slope_bound_match_reference(
    backend, prior, dtype, low_thresholds, monkeypatch
):
    """Where the slope is not free to read (an accelerator, ``torch.compile``), its runs of queries
    come from the prior's ``slope_bound`` (here runs of 2^6 / 1 queries for GOAT's default cap)."""
    monkeypatch.setattr(prior_inputs, "values_are_free", lambda t: False)
    assert prior_inputs.largest_slope(make_prior(prior, 2).fold_slope(), 1.5) == 1.5
    check_route(backend, {**LONG, **LONG_CASES["docs-prefill"], "prior": prior}, dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@settings(max_examples=30, deadline=None)
@given(o=problems())
def test_memeff_as_torch_compile_traces_it_matches_reference(dtype, o):
    """Under ``torch.compile`` ``memeff``'s blocks run through public operators with activation
    checkpointing (``memeff.checkpointed_blocks``) and no shortcut reads a value: here eagerly, as
    the compiler traces it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.compiler, "is_compiling", lambda: True)
        check_route("memeff", o, dtype)
