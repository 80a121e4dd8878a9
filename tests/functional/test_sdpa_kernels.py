"""The mask-free bottom-right causal kernels behind chunked SDPA calls, against a dense softmax:
the CPU flash kernel and the public-operator one that other devices use."""

from __future__ import annotations

import copy

import pytest
import torch
from factories import flushes, make_prior
from torch import Tensor

import priorattn
from priorattn.functional import prior_inputs
from priorattn.functional.masks import Masking
from priorattn.functional.sdpa import flash, planning, route
from priorattn.functional.sdpa.flash import LowerRightCausal
from priorattn.functional.sdpa.route import lower_right_kernel, public_lower_right_causal
from priorattn.functional.spans import Kind
from priorattn.priors import GOAT, ALiBi, FoldLanes, Prior, Sum
from priorattn.priors.math import inverse_softplus


def dense_lower_right(q, k, v):
    Lq, Lk = q.shape[2], k.shape[2]
    visible = torch.arange(Lk)[None, :] <= torch.arange(Lk - Lq, Lk)[:, None]
    return torch.softmax((q @ k.transpose(-1, -2)).masked_fill(~visible, -torch.inf), -1) @ v


@pytest.mark.parametrize("kernel", [LowerRightCausal.apply, public_lower_right_causal], ids=["cpu", "public"])
@pytest.mark.parametrize("Lq, Lk, Dk, Dv", [(5, 12, 8, 6), (7, 20, 6, 8), (3, 3, 8, 8), (1, 9, 4, 4)])
def test_lower_right_causal_matches_dense_softmax_and_gradcheck(kernel, Lq, Lk, Dk, Dv):
    gen = torch.Generator().manual_seed(Lq + Lk)
    q = torch.randn(2, 3, Lq, Dk, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 3, Lk, Dk, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 3, Lk, Dv, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.allclose(kernel(q, k, v), dense_lower_right(q, k, v), atol=1e-12)
    assert torch.autograd.gradcheck(kernel, (q, k, v))


def test_the_cpu_flash_kernel_runs_only_on_the_cpu():
    assert lower_right_kernel(torch.device("cpu")) == LowerRightCausal.apply
    assert lower_right_kernel(torch.device("cuda")) is public_lower_right_causal
    assert lower_right_kernel(torch.device("meta")) is public_lower_right_causal


def test_a_prior_takes_the_flash_kernel_and_its_backward_only_on_the_cpu():
    assert route.folded_calls_kernel(torch.device("cpu")) is flash.folded_calls
    assert route.folded_calls_kernel(torch.device("cuda")) is route.autograd_calls


def alibi_plans(L: int, chunk: int) -> list[tuple[slice, list[slice]]]:
    pos = torch.arange(L)[None]
    slope = ALiBi(4).fold(pos, pos).slope
    masking = Masking(True, pos, pos, starts=(0, 0))
    plans = planning.head_plans(masking, None, slope, ALiBi(4).slope_bound(), torch.float32, 4, chunk)
    return [(heads, [call.rows for call in calls]) for heads, calls in plans]


def test_heads_whose_slopes_allow_longer_runs_take_fewer_calls():
    """ALiBi's slopes 1/4, 1/16, 1/64, 1/256 allow float32 runs of 1024, 4096, 16384, 65536
    queries: at L = 2048 head 0 takes two runs and heads 1-3 one call together; in chunks of two
    heads (two threads), heads 0-1 take the runs. With chunks of every head (the public-operator
    route) every head takes the steepest head's runs."""
    halves = [slice(0, 1024), slice(1024, 2048)]
    assert alibi_plans(2048, chunk=1) == [(slice(0, 1), halves), (slice(1, 4), [slice(0, 2048)])]
    assert alibi_plans(2048, chunk=2) == [(slice(0, 2), halves), (slice(2, 4), [slice(0, 2048)])]
    assert alibi_plans(2048, chunk=3) == [(slice(0, 3), halves), (slice(3, 4), [slice(0, 2048)])]
    assert alibi_plans(2048, chunk=4) == [(slice(0, 4), halves)]
    assert alibi_plans(1024, chunk=1) == [(slice(0, 4), [slice(0, 1024)])]


@pytest.mark.parametrize(
    "batch, threads, chunk", [(1, 1, 1), (1, 2, 2), (2, 2, 1), (3, 2, 2), (2, 4, 2), (1, 4, 4), (6, 4, 2)]
)
def test_heads_come_in_chunks_that_keep_every_thread_of_the_backward_busy(batch, threads, chunk):
    """The kernel's backward gives each (batch row, head) of a call to one thread: a chunk's calls
    have a multiple of ``threads`` of them."""
    assert planning.heads_per_thread_team(batch, threads) == chunk


@pytest.mark.parametrize("chunk", [1, 2, 3])
@pytest.mark.parametrize("Hkv", [4, 2])
def test_heads_in_runs_of_their_own_match_the_reference(Hkv, chunk, monkeypatch):
    """Heads whose slopes give them different runs (not in slope order), alone or in chunks (of
    which the last is shorter), with the sink's key bias and grouped keys: output and every
    gradient against the float64 reference."""
    monkeypatch.setitem(prior_inputs.SLOPE_MAGNITUDE, torch.float64, 2.0**4)  # runs of 16 / |m|
    monkeypatch.setattr(route, "heads_per_thread_team", lambda batch, threads: chunk)
    prior = GOAT(4, 2, init="alibi").double()
    with torch.no_grad():
        prior.slope_raw.copy_(
            inverse_softplus(torch.tensor([0.5, 0.5, 0.01, 0.2]))
        )  # runs of 32, 32, all, 80
    gen = torch.Generator().manual_seed(Hkv)
    q = torch.randn(2, 4, 200, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    k, v = (
        torch.randn(2, Hkv, 200, 6, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(2)
    )
    results = []
    for backend in ("sdpa", "reference"):
        out = priorattn.attention(q, k, v, prior=prior, causal=True, backend=backend)
        grads = torch.autograd.grad(
            out, [q, k, v, *prior.parameters()], torch.ones_like(out), allow_unused=True
        )
        results.append([out, *grads])
    for mine, ref in zip(*results, strict=True):
        assert (mine is None) == (ref is None)
        assert mine is None or torch.allclose(mine, ref, atol=1e-10)


def steep_goat(slopes: list[float], seed: int = 0) -> Sum:
    """GOAT in float64 with random spectral weights and sink (a key bias in the reach) plus an ALiBi
    of ``slopes``: GOAT's own slope is never negative (issue 28), and routes must plan any slope."""
    goat = make_prior("goat_noslope", len(slopes), seed)
    return Sum(goat, ALiBi(len(slopes), slopes=torch.tensor(slopes, dtype=torch.float64)))


def band_widths(bands: Tensor, Lk: int) -> Tensor:
    """``(H,)``: per head, the most keys before a query's own key that :func:`planning.weight_bands`
    keeps (``Lk - 1``: every key)."""
    own = torch.arange(Lk - bands.shape[-1], Lk)
    return (own - bands).amax(-1)


def left_out(bands: Tensor, Lk: int) -> Tensor:
    """``(H, Lq, Lk)``: the keys :func:`planning.weight_bands` leaves out of each query's row."""
    return torch.arange(Lk) < bands[..., None]


#: Slopes whose bands (in the dtype) leave keys out at a few hundred positions: heads 0 and 1 have
#: bands, head 2's covers every key, head 3's slope is negative (an anti-recency head: no band).
STEEP = {torch.float64: [30.0, 8.0, 0.05, -0.5], torch.float32: [4.0, 1.0, 0.05, -0.5]}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_slope_bands_bound_the_weight_of_every_key_they_leave_out(dtype, monkeypatch):
    """Every key more than a head's band before a query's own key has a weight below
    ``sqrt(finfo.tiny)`` (the float64 reference's), and the steep heads' bands are short."""
    monkeypatch.setattr(planning, "BAND_RUN", 64)
    prior = steep_goat(STEEP[dtype])
    gen = torch.Generator().manual_seed(1)
    Lq, Lk = 150, 200
    q, k, v = (torch.randn(2, 4, L, 6, generator=gen, dtype=torch.float64) for L in (Lq, Lk, Lk))
    pos = torch.arange(Lk)[None]
    masking = Masking(True, pos[:, Lk - Lq :], pos, starts=(Lk - Lq, 0))
    lanes = prior.fold(masking.q_pos, masking.k_pos)
    bands = planning.weight_bands(q.to(dtype), k.to(dtype), lanes, 6**-0.5, masking)
    widths = band_widths(bands, Lk)
    assert widths[0] < 40 and widths[1] < Lk and not bands[2:].any()
    keys = torch.eye(Lk, dtype=torch.float64).expand(2, 4, Lk, Lk)  # values that return the weights
    weights = priorattn.attention(q, k, keys, prior=prior, causal=True, backend="reference")
    lag = torch.arange(Lk - Lq, Lk)[:, None] - torch.arange(Lk)[None, :]  # own key minus key index
    tiny = torch.finfo(dtype).tiny ** 0.5
    for h, width in enumerate(widths[:2].tolist()):
        assert (weights[:, h][:, left_out(bands, Lk)[h]] < tiny).all()
        assert (weights[:, h][:, lag == width // 4] > tiny).any()  # a band is not vastly too wide


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_slope_bands_under_row_factors_bound_the_weight_of_every_key_they_leave_out(dtype, monkeypatch):
    """With query i's row factor ``r_i`` on the prior (GOAT's query gate, SSMax scaling the prior) and
    an SSMax factor ``f_i`` on the content, the logits ``f_i scale <q_i, k_j> + r_i K_h(i, j)``
    (written out here) give every key beyond a head's band a weight below ``sqrt(finfo.tiny)``; a
    head whose row factor reaches 0 has no band."""
    monkeypatch.setattr(planning, "BAND_RUN", 64)
    prior = steep_goat(STEEP[dtype])
    gen = torch.Generator().manual_seed(2)
    Lq, Lk = 150, 200
    q, k = (torch.randn(2, 4, L, 6, generator=gen, dtype=torch.float64) for L in (Lq, Lk))
    factor = 1 + torch.rand(2, 4, Lq, 1, generator=gen, dtype=torch.float64)  # SSMax's s log n
    row_factor = 0.4 + 0.6 * torch.rand(2, 4, Lq, 1, generator=gen, dtype=torch.float64)  # a gate
    pos = torch.arange(Lk)[None]
    masking = Masking(True, pos[:, Lk - Lq :], pos, starts=(Lk - Lq, 0))
    lanes = prior.fold(masking.q_pos, masking.k_pos)
    bands = planning.weight_bands(
        q.to(dtype), k.to(dtype), lanes, 6**-0.5, masking, factor.to(dtype), row_factor.to(dtype)
    )
    widths = band_widths(bands, Lk)
    assert widths[0] < 100 and widths[1] < Lk and not bands[2:].any()
    lag = torch.arange(Lk - Lq, Lk)[:, None] - torch.arange(Lk)[None, :]  # own key minus key index
    logits = 6**-0.5 * factor * (q @ k.transpose(-1, -2)) + row_factor * prior.log_prior(
        masking.q_pos, masking.k_pos
    )
    weights = torch.softmax(logits.masked_fill(lag < 0, -torch.inf), dim=-1)
    tiny = torch.finfo(dtype).tiny ** 0.5
    for h, width in enumerate(widths[:2].tolist()):
        assert (weights[:, h][:, left_out(bands, Lk)[h]] < tiny).all()
        assert (weights[:, h][:, lag == width // 4] > tiny).any()  # a band is not vastly too wide
    row_factor[1, 1, 7] = 0.0
    args = (q.to(dtype), k.to(dtype), lanes, 6**-0.5, masking, factor.to(dtype), row_factor.to(dtype))
    gated = planning.weight_bands(*args)
    assert torch.equal(gated[0], bands[0]) and not gated[1].any()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_gated_steep_heads_take_bands_and_match_the_reference(dtype, monkeypatch):
    """GOAT with its query gate and steep learned slopes: the steep heads' calls leave out the keys
    without weight (the gate's smallest factor widens their bands), and the output and every
    gradient, of the gate's parameters too, match the float64 reference."""
    monkeypatch.setattr(planning, "BAND_RUN", 64)
    starts = []
    plan = planning.plan_calls
    monkeypatch.setattr(
        planning, "plan_calls", lambda *a: starts.extend(c.cols.start for c in plan(*a)) or plan(*a)
    )
    prior = GOAT(4, 3, gate=True, train_len=64, sink_freqs=2, sink_hidden=4, max_slope=32.0).double()
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in prior.parameters():
            p.copy_(torch.rand(p.shape, generator=gen, dtype=torch.float64) - 0.5)
        prior.slope_raw.copy_(inverse_softplus(torch.tensor(STEEP[dtype][:2] + [0.05, 0.01])))
        prior.gate_bias.fill_(3.0)  # gates of about 0.95
        prior.gate_scale_raw.fill_(-3.0)
    L = 300
    q, k, v = (torch.randn(2, 4, L, 6, generator=gen, dtype=torch.float64) for _ in range(3))
    results = []
    for backend, params in (("sdpa", copy.deepcopy(prior).to(dtype)), ("reference", prior)):
        inputs = [t.to(params.alpha.dtype).requires_grad_() for t in (q, k, v)]
        out = priorattn.attention(*inputs, prior=params, causal=True, backend=backend)
        grads = torch.autograd.grad(out, [*inputs, *params.parameters()], torch.ones_like(out))
        results.append([out, *grads])
    assert max(starts) > 0  # some call left out keys before its queries
    tolerance = {torch.float64: 1e-10, torch.float32: 2e-5}[dtype]
    for i, (mine, ref) in enumerate(zip(*results, strict=True)):
        scale = 1 + ref.abs().max()
        assert (mine.double() - ref).abs().max() <= (1 if i == 0 else 20) * tolerance * scale, i


def forget_gates(B: int, Hkv: int, L: int, gen: torch.Generator) -> Tensor:
    """Logits of FoX's forget gates ``(B, 4, L)`` float64: head 0 forgets about 6 nats per key, head 1
    about 2, head 2 about 0.05 (a band wider than 300 keys), head 3 none (gates of 1)."""
    shift = torch.tensor([-6.0, -2.0, 3.0, 50.0], dtype=torch.float64)[:, None]
    return torch.randn(B, 4, L, generator=gen, dtype=torch.float64) + shift


def fox_key_bias(gates: Tensor) -> Tensor:
    """FoX's key bias ``-F_j``: minus the cumulative sum of the log forget gates (Lin et al. 2025)."""
    return -torch.nn.functional.logsigmoid(gates).cumsum(-1)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_key_bias_bands_bound_the_weight_of_every_key_they_leave_out(dtype, monkeypatch):
    """FoX's ``-F_j`` without a slope: every key a band leaves out has a weight below
    ``sqrt(finfo.tiny)`` in the float64 reference, a fast-forgetting head leaves out most keys, and
    heads that forget slowly or not at all leave out none."""
    monkeypatch.setattr(planning, "BAND_RUN", 64)
    gen = torch.Generator().manual_seed(4)
    Lq, Lk = 250, 300
    q, k = (torch.randn(2, 4, L, 6, generator=gen, dtype=torch.float64) for L in (Lq, Lk))
    key_bias = fox_key_bias(forget_gates(2, 4, Lk, gen))
    pos = torch.arange(Lk)[None]
    masking = Masking(True, pos[:, Lk - Lq :], pos, starts=(Lk - Lq, 0))
    lanes = FoldLanes(torch.zeros(1, 4, Lq, 0), torch.zeros(1, 1, Lk, 0), key_bias)
    bands = planning.weight_bands(q.to(dtype), k.to(dtype), lanes, 6**-0.5, masking)
    widths = band_widths(bands, Lk)
    assert widths[0] < 80 and widths[1] < Lk - 1 and not bands[2:].any()
    keys = torch.eye(Lk, dtype=torch.float64).expand(2, 4, Lk, Lk)  # values that return the weights
    weights = priorattn.attention(q, k, keys, key_bias=key_bias, causal=True, backend="reference")
    tiny = torch.finfo(dtype).tiny ** 0.5
    for h in range(2):
        assert (weights[:, h][:, left_out(bands, Lk)[h]] < tiny).all()


def test_a_far_key_that_a_key_bias_lifts_again_is_not_left_out(monkeypatch):
    """A key bias that climbs and falls: one early key raised above every later key outweighs the keys
    near every later query, though FoX's decay alone would leave it out. The bands keep it (they
    follow the running maximum of the bias), and the route matches the reference."""
    monkeypatch.setattr(planning, "BAND_RUN", 64)
    gen = torch.Generator().manual_seed(5)
    L = 300
    q, k, v = (torch.randn(1, 4, L, 6, generator=gen, dtype=torch.float64) for _ in range(3))
    key_bias = fox_key_bias(forget_gates(1, 4, L, gen))
    key_bias[:, 0, 10] = key_bias[:, 0].max() + 1.0
    pos = torch.arange(L)[None]
    lanes = FoldLanes(torch.zeros(1, 4, L, 0), torch.zeros(1, 1, L, 0), key_bias)
    bands = planning.weight_bands(q, k, lanes, 6**-0.5, Masking(True, pos, pos, starts=(0, 0)))
    assert bands[0, 11:].max() <= 10 and bands[1].max() > 10  # head 1 has no such key
    keys = torch.eye(L, dtype=torch.float64).expand(1, 4, L, L)
    weights = priorattn.attention(q, k, keys, key_bias=key_bias, causal=True, backend="reference")
    assert weights[0, 0, -1, 10] > 1e-3  # the raised key matters to the last query
    out = priorattn.attention(q, k, v, key_bias=key_bias, causal=True, backend="sdpa")
    ref = priorattn.attention(q, k, v, key_bias=key_bias, causal=True, backend="reference")
    assert torch.allclose(out, ref, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("Hkv", [4, 2])
def test_fox_leaves_out_the_keys_without_weight_and_matches_the_reference(Hkv, dtype, monkeypatch):
    """FoX through ``sdpa``: fast-forgetting heads take calls that leave out the keys before their
    band (runs of 64 queries, after a cached prefix); output and the gradients of q, k, v and the
    forget gates against the float64 reference within the route tests' tolerances."""
    monkeypatch.setattr(planning, "BAND_RUN", 64)
    starts = []
    plan = planning.plan_calls
    monkeypatch.setattr(
        planning, "plan_calls", lambda *a: starts.extend(c.cols.start for c in plan(*a)) or plan(*a)
    )
    gen = torch.Generator().manual_seed(Hkv)
    Lq, Lk = 250, 300
    q = torch.randn(2, 4, Lq, 6, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, Hkv, Lk, 6, generator=gen, dtype=torch.float64) for _ in range(2))
    gates = forget_gates(2, 4, Lk, gen)
    results = []
    for backend, precision in (("sdpa", dtype), ("reference", torch.float64)):
        inputs = [t.to(precision).requires_grad_() for t in (q, k, v)] + [gates.clone().requires_grad_()]
        out = priorattn.attention(*inputs[:3], key_bias=fox_key_bias(inputs[3]), causal=True, backend=backend)
        results.append([out, *torch.autograd.grad(out, inputs, torch.ones_like(out))])
    assert max(starts) > Lk - Lq  # some call left out keys after the cached prefix
    tolerance = {torch.float64: 1e-10, torch.float32: 2e-5}[dtype]
    for i, (mine, ref) in enumerate(zip(*results, strict=True)):
        scale = 1 + ref.abs().max()
        assert (mine.double() - ref).abs().max() <= (1 if i == 0 else 20) * tolerance * scale, i


def test_chunks_with_close_bands_share_one_plan_and_distant_ones_keep_their_own():
    """Heads (chunks of one) whose bands keep 300 and 320 keys take one plan, each run's keys from
    the wider band; a band of 40 beside them would cost more than a tenth more cells and keeps its
    own, as does a head whose band leaves out too little to be taken."""
    L = 4096
    pos = torch.arange(L)[None]
    widths = torch.tensor([300, 320, 40, 3000])[:, None]
    bands = (torch.arange(L) - widths).clamp(min=0)
    plans = planning.head_plans(
        Masking(True, pos, pos, starts=(0, 0)), None, None, 0.0, torch.float32, 4, 1, bands
    )
    assert [heads for heads, _ in plans] == [slice(0, 2), slice(2, 3), slice(3, 4)]
    assert [call.cols.start for call in plans[0][1]] == [max(0, r - 320) for r in range(0, L, 1024)]
    assert [call.cols.start for call in plans[1][1]] == [max(0, r - 40) for r in range(0, L, 1024)]
    assert [call.cols.start for call in plans[2][1]] == [0]


def test_no_band_without_a_positive_slope_or_under_other_masks_or_in_one_run(monkeypatch):
    """A flat or anti-recency slope gives no band, nor do masks other than plain causal ones, nor
    up to ``BAND_RUN`` queries (one run, whose causal square leaves no key out)."""
    q = k = torch.randn(1, 2, 300, 4)
    pos = torch.arange(300)[None]
    lanes = steep_goat([4.0, 4.0]).float().fold(pos, pos)
    assert planning.weight_bands(q, k, lanes, 0.5, Masking(True, pos, pos, starts=(0, 0))) is None
    monkeypatch.setattr(planning, "BAND_RUN", 64)
    assert planning.weight_bands(q, k, lanes, 0.5, Masking(True, pos, pos, starts=(0, 0))) is not None
    for slopes in ([0.0, 0.0], [-1.0, -2.0]):
        flat = steep_goat(slopes).float().fold(pos, pos)
        assert planning.weight_bands(q, k, flat, 0.5, Masking(True, pos, pos, starts=(0, 0))) is None
    assert planning.weight_bands(q, k, lanes, 0.5, Masking(True, pos, pos, window=50, starts=(0, 0))) is None
    assert planning.weight_bands(q, k, lanes, 0.5, Masking(False, pos, pos, starts=(0, 0))) is None


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_half_precision_takes_the_bands_of_float32(half, monkeypatch):
    """The kernel sums half-precision logits in float32: bands leave out weights below float32's
    ``sqrt(tiny)``, not float16's (2^-7, which would be an error)."""
    monkeypatch.setattr(planning, "BAND_RUN", 64)
    pos = torch.arange(300)[None]
    masking = Masking(True, pos, pos, starts=(0, 0))
    lanes = steep_goat([4.0, 1.0]).float().fold(pos, pos)
    q, k = (torch.randn(1, 2, 300, 8, generator=torch.Generator().manual_seed(i)) for i in range(2))
    single = planning.weight_bands(q, k, lanes, 0.5, masking)
    halved = planning.weight_bands(q.to(half), k.to(half), lanes, 0.5, masking)
    assert (single - halved).abs().max() <= 1, (single, halved)


@pytest.mark.parametrize("chunk", [1, 2, 4])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("Hkv", [4, 2])
def test_steep_heads_leave_out_the_keys_without_weight_and_match_the_reference(
    Hkv, dtype, chunk, monkeypatch
):
    """Heads with bands take calls that start their keys a band before their first query (runs of
    64 queries, after a cached prefix), alone or in chunks: output and every gradient, of the
    prior's parameters too, against the float64 reference within the route tests' tolerances."""
    monkeypatch.setattr(route, "heads_per_thread_team", lambda batch, threads: chunk)
    monkeypatch.setattr(planning, "BAND_RUN", 64)
    starts = []
    plan = planning.plan_calls
    monkeypatch.setattr(
        planning, "plan_calls", lambda *a: starts.extend(c.cols.start for c in plan(*a)) or plan(*a)
    )
    prior = steep_goat(STEEP[dtype], seed=Hkv).to(dtype)  # the reference's: the same, in float64
    gen = torch.Generator().manual_seed(Hkv)
    Lq, Lk = 250, 300
    q = torch.randn(2, 4, Lq, 6, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, Hkv, Lk, 6, generator=gen, dtype=torch.float64) for _ in range(2))
    results = []
    for backend, tensors, params in (
        ("sdpa", (q, k, v), prior),
        ("reference", (q, k, v), copy.deepcopy(prior).double()),
    ):
        inputs = [t.to(params.parts[0].alpha.dtype).requires_grad_() for t in tensors]
        out = priorattn.attention(*inputs, prior=params, causal=True, backend=backend)
        grads = torch.autograd.grad(
            out, [*inputs, *params.parameters()], torch.ones_like(out), allow_unused=True
        )
        results.append([out, *grads])
    # Some call left out keys of the cached prefix and after it; in one chunk of every head, head 2
    # (whose band covers every key) leaves no key out.
    assert (max(starts) > Lk - Lq) == (chunk < 4)
    tolerance = {torch.float64: 1e-10, torch.float32: 2e-5}[dtype]
    for i, (mine, ref) in enumerate(zip(*results, strict=True)):
        assert (mine is None) == (ref is None)
        if mine is not None:
            scale = 1 + ref.abs().max()
            assert (mine.double() - ref).abs().max() <= (1 if i == 0 else 20) * tolerance * scale, i


@pytest.mark.parametrize("runs", [False, True], ids=["one-call", "runs"])
def test_values_as_wide_as_the_folded_queries_come_back_unchanged_and_match_the_reference(runs, monkeypatch):
    """The backward writes the gradients of q', k', v' into them where the heads take several runs;
    with values as wide as q' (no padding) v' is v itself, which must be copied, not overwritten."""
    if runs:  # ALiBi's slopes 1/16, 1/256: head 0 in runs of 16 queries, head 1 in one call
        monkeypatch.setitem(prior_inputs.SLOPE_MAGNITUDE, torch.float64, 1.0)
    prior = ALiBi(2).double()
    gen = torch.Generator().manual_seed(0)
    q, k = (
        torch.randn(1, 2, 50, 5, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(2)
    )
    v = torch.randn(1, 2, 50, 5 + prior.fold_width, generator=gen, dtype=torch.float64, requires_grad=True)
    before = [t.detach().clone() for t in (q, k, v)]
    results = []
    for backend in ("sdpa", "reference"):
        out = priorattn.attention(q, k, v, prior=prior, causal=True, backend=backend)
        results.append([out, *torch.autograd.grad(out, [q, k, v], torch.ones_like(out))])
    assert all(torch.equal(t, copy) for t, copy in zip((q, k, v), before))
    for mine, ref in zip(*results, strict=True):
        assert torch.allclose(mine, ref, atol=1e-10)


class NoLanes(Prior):
    """A prior that folds into no lane at all (``K = 0``): ``k'``, ``v'`` are k, v themselves."""

    def log_prior(self, q_pos, k_pos):
        return torch.zeros(1, q_pos.shape[-1], k_pos.shape[-1], dtype=torch.float64)

    def can_fold(self, causal):
        return True

    def fold(self, q_pos, k_pos):
        return FoldLanes(torch.zeros(1, q_pos.shape[-1], 0), torch.zeros(1, k_pos.shape[-1], 0))


def test_calls_on_k_v_themselves_leave_them_unchanged(monkeypatch):
    """A fold of no lanes hands the kernel k and v themselves; calls of 10 queries each write their
    query gradients into q' (scaled q), and nothing into k or v."""
    monkeypatch.setattr(planning, "MASK_CHUNK_CELLS", 10 * 30)
    gen = torch.Generator().manual_seed(1)
    q, k, v = (
        torch.randn(1, 2, 30, 4, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(3)
    )
    doc_ids = torch.tensor([[0] * 12 + [1] * 18])
    before = [t.detach().clone() for t in (q, k, v)]
    results = []
    for backend in ("sdpa", "reference"):
        out = priorattn.attention(q, k, v, prior=NoLanes(), causal=True, doc_ids=doc_ids, backend=backend)
        results.append([out, *torch.autograd.grad(out, [q, k, v], torch.ones_like(out))])
    assert all(torch.equal(t, copy) for t, copy in zip((q, k, v), before))
    for mine, ref in zip(*results, strict=True):
        assert torch.allclose(mine, ref, atol=1e-10)


def test_one_call_keeps_its_graph_for_a_second_backward_and_runs_say_they_cannot(monkeypatch):
    """One call over every head and row leaves the saved q', k', v' as they were: a kept graph gives
    the same gradients again. Runs of heads write their gradients into the saved q' and k' (memory at
    long lengths, :class:`~priorattn.functional.sdpa.flash.FoldedCalls`), so autograd refuses a
    second pass."""
    prior = GOAT(2, 2, init="alibi").double()
    q, k, v = (torch.randn(1, 2, 40, 6, dtype=torch.float64, requires_grad=True) for _ in range(3))

    def gradients():
        return torch.autograd.grad(out.sum(), [q, k, v, prior.slope_raw], retain_graph=True)

    out = priorattn.attention(q, k, v, prior=prior, causal=True, backend="sdpa")
    first, second = gradients(), gradients()
    assert all(torch.equal(a, b) for a, b in zip(first, second))

    monkeypatch.setitem(prior_inputs.SLOPE_MAGNITUDE, torch.float64, 1.0)  # runs of 4 and 16 queries
    out = priorattn.attention(q, k, v, prior=prior, causal=True, backend="sdpa")
    gradients()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        gradients()


def saved_elements(run) -> int:
    """Elements of the distinct tensors autograd keeps for the backward of ``run()``."""
    kept = {}

    def keep(t):
        kept[(t.untyped_storage().data_ptr(), t.storage_offset(), t.shape)] = t.numel()
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        run()
    return sum(kept.values())


@pytest.mark.parametrize("prior", [ALiBi(4), GOAT(4, 4, init="alibi")], ids=["alibi", "goat"])
def test_a_slope_re_centred_on_every_run_of_queries_saves_only_o_of_l(prior, monkeypatch):
    """Issue 13: autograd through the re-centred runs kept each run's k' = [k, lanes, slope lane],
    O(L^2 / run) in all (1.5x plain SDPA's peak memory at L = 16384). The route keeps one q', k', v'
    of every query and key, the output and its log-sum-exp, and re-centres the slope lane per run."""
    monkeypatch.setitem(prior_inputs.SLOPE_MAGNITUDE, torch.float32, 2.0**4)  # runs of 64 queries
    monkeypatch.setattr(flash, "KEY_BLOCK", 256)
    B, H, L, D = 1, 4, 2048, 16
    q, k, v = (torch.randn(B, H, L, D, requires_grad=True) for _ in range(3))

    def run():
        priorattn.attention(q, k, v, prior=prior, causal=True, backend="sdpa")

    width = D + prior.fold_width
    # q', k', v', the output (width lanes each) and the log-sum-exp: about 4 B H L width.
    assert saved_elements(run) <= 5 * B * H * L * width
    # Autograd through the runs keeps every run's k' and v': 2 x 16.5 L x width for 32 runs.
    monkeypatch.setattr(route, "folded_calls_kernel", lambda device: route.autograd_calls)
    assert saved_elements(run) > 30 * B * H * L * width


def test_the_cpu_route_flushes_subnormals_in_its_calls_and_leaves_the_callers_mode():
    """Tiny weights of distant keys make the CPU kernel's backward slow when they are subnormal; the
    route's kernel calls run where they flush (``subnormals.py``), and the caller's mode stays its
    own after, whichever it was."""
    q, k, v = (torch.randn(1, 2, 300, 8, requires_grad=True) for _ in range(3))

    during, after = [], []

    def watched(work):
        def run(*args):
            during.append(flushes())
            return work(*args)

        return run

    for before in (False, True):
        torch.set_flush_denormal(before)
        try:
            with pytest.MonkeyPatch.context() as patch:
                for name in ("flash_call", "heads_backward"):  # the forward's calls, the backward's
                    patch.setattr(flash, name, watched(getattr(flash, name)))
                out = priorattn.attention(q, k, v, prior=ALiBi(2), causal=True, backend="sdpa")
                after.append(flushes())
                out.sum().backward()
                after.append(flushes())
        finally:
            torch.set_flush_denormal(False)
    assert during == [True] * 4  # forward and backward, each way
    assert after == [False, False, True, True]


@pytest.mark.parametrize("Lq", [0, 3])
def test_a_prior_whose_queries_see_no_key_gives_zeros_and_a_zero_query_gradient(Lq):
    q = torch.randn(1, 2, Lq, 8, requires_grad=True)
    k = torch.randn(1, 2, 3, 8, requires_grad=True)
    doc_ids = (torch.tensor([[5, 6, 7]])[:, :Lq], torch.tensor([[1, 2, 3]]))
    out = priorattn.attention(
        q, k, k, prior=GOAT(2, 2, slope=False), causal=False, doc_ids=doc_ids, backend="sdpa"
    )
    assert torch.equal(out, torch.zeros_like(out))
    out.sum().backward()
    assert torch.equal(q.grad, torch.zeros_like(q))


def test_importing_the_library_leaves_torch_dynamo_unloaded():
    """The public bottom-right kernel's torch module pulls in torch._dynamo and sympy (about a second
    and 70 MB); only non-CPU devices use it, so it is imported there, not with the library."""
    import subprocess
    import sys

    code = "import sys, priorattn, priorattn.cli; print('torch._dynamo' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


@pytest.mark.parametrize("prior", [None, "goat"])
def test_a_single_query_takes_one_unmasked_call_and_matches_the_reference(prior, monkeypatch):
    """A decode step (one query, causal, after a cache) sees every key of its call: the plan is one
    FULL call, not a causal split; output and gradients equal the reference's."""
    pos = torch.arange(40)[None]
    calls = planning.plan_calls(Masking(True, pos[:, -1:], pos, starts=(39, 0)), None, None)
    assert [(c.rows, c.cols, c.kind) for c in calls] == [(slice(0, 1), slice(0, 40), Kind.FULL)]
    two_rows = planning.plan_calls(Masking(True, pos[:, -2:], pos, starts=(38, 0)), None, None)
    assert [c.kind for c in two_rows] == [Kind.CAUSAL]
    prior = None if prior is None else make_prior(prior, 2, seed=3)
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(2, 2, 1, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(2, 2, 40, 8, generator=gen, dtype=torch.float64, requires_grad=True) for _ in "kv")
    grads = []
    for backend in ("sdpa", "reference"):
        out = priorattn.attention(q, k, v, prior=prior, backend=backend)
        grads.append((out, *torch.autograd.grad(out.square().sum(), (q, k, v))))
    for mine, ref in zip(*grads):
        torch.testing.assert_close(mine, ref, rtol=0, atol=1e-12)
