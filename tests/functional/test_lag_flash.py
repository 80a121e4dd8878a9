"""The blockwise route's flash path (``lag_flash``): a lag table through the CPU flash kernel."""

from __future__ import annotations

import math

import pytest
import torch
from factories import make_prior
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_routes import check_route

import priorattn
from priorattn.functional import lag_flash
from priorattn.functional.lag_flash import (
    anti_diagonal_sums,
    call_bands,
    content_reach,
    empty_rows,
    masked_table,
    shifted_row_sums,
    smallest_log_weight,
    weight_bands,
)
from priorattn.functional.masks import Masking
from priorattn.functional.memeff import key_blocks
from priorattn.functional.prior_inputs import lag_table
from priorattn.priors import GGD, T5Bias

#: Priors whose log-prior depends on the lag only (the path's table), and no prior.
LAG_PRIORS = ("uniform", "alibi", "ggd", "ggd_negative")


@st.composite
def lag_problems(draw):
    """A random call the flash path computes: positions one run, masks on lags only (causal order,
    a window), a relative prior or none (then with or without SSMax), equal q/k and v widths."""
    Hkv = draw(st.integers(1, 2))
    Lk = draw(st.integers(1, 40))
    D = draw(st.sampled_from([4, 8]))
    prior = draw(st.sampled_from(LAG_PRIORS))
    return dict(
        B=draw(st.integers(1, 2)),
        H=Hkv * draw(st.sampled_from([1, 2])),
        Hkv=Hkv,
        Lq=draw(st.integers(1, Lk)),
        Lk=Lk,
        Dk=D,
        Dv=D,
        causal=draw(st.booleans()),
        offset=draw(st.sampled_from([0, 3, 1000])),
        prior=prior,
        seed=draw(st.integers(0, 2**16)),
        window=draw(st.sampled_from([None, None, 1, 5])),
        docs=False,
        padding=False,
        ssmax=prior == "uniform" and draw(st.booleans()),  # SSMax scales a prior's bias too
        batched_pos=False,
    )


@pytest.fixture
def small_blocks(monkeypatch):
    """Several kernel calls, backward tiles and runs of keys in the kernel's backward even at the
    tests' short lengths; counts the calls."""
    monkeypatch.setattr(lag_flash, "FLASH_ROWS", 7)
    monkeypatch.setattr(lag_flash, "BACKWARD_KEYS", 5)
    monkeypatch.setattr(lag_flash, "TILE_ROWS", 3)
    return counted(monkeypatch, lag_flash.LagTableFlash, "apply")


def counted(monkeypatch, owner, name: str) -> list:
    """``owner.name`` patched to record each call in the list returned, then run as before."""
    calls, original = [], getattr(owner, name)
    monkeypatch.setattr(owner, name, lambda *a: calls.append(1) or original(*a))
    return calls


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(o=lag_problems())
def test_flash_path_matches_reference(dtype, o, small_blocks):
    """Forward and backward (the kernel's backward when the prior is frozen, the tiles when the
    table needs its gradient) against the float64 reference. The fixture only sets sizes and
    counts calls, so sharing it between examples is safe."""
    small_blocks.clear()
    check_route("memeff", o, dtype)
    assert small_blocks, "the call did not take the flash path"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_flash_path_hands_half_precision_to_the_kernel(dtype, monkeypatch):
    """Half-precision q, k, v reach the kernel as they are (as SDPA takes them), with the float32
    table as the mask; the log-sum-exp and the backward's sums stay float32, and the gradients come
    back in the inputs' dtype."""
    seen = []
    kernel = lag_flash.flash

    def recorded(q, k, v, *args, attn_mask, **kwargs):
        seen.append((q.dtype, k.dtype, v.dtype, attn_mask.dtype))
        return kernel(q, k, v, *args, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(lag_flash, "flash", recorded)
    q, k, v = (torch.randn(2, 2, 30, 8, dtype=dtype, requires_grad=True) for _ in range(3))
    out = priorattn.attention(q, k, v, prior=GGD(2, init="alibi"), backend="memeff")
    grads = torch.autograd.grad(out.float().square().sum(), (q, k, v))
    assert seen and set(seen) == {(dtype, dtype, dtype, torch.float32)}
    assert out.dtype == dtype and all(g.dtype == dtype for g in grads)


@pytest.mark.parametrize("prior", ["ggd", "none"])
def test_flash_path_long_causal_and_prefill_match_reference(prior, small_blocks):
    """Lengths past a real block (256 rows) and tile (64-128 rows), with the default sizes."""
    lag_flash.FLASH_ROWS, lag_flash.TILE_ROWS, lag_flash.BACKWARD_KEYS = 256, 256, 2048
    for Lq, Lk in [(600, 600), (300, 700)]:
        o = dict(B=1, H=2, Hkv=1, Lq=Lq, Lk=Lk, Dk=8, Dv=8, causal=True, offset=0, seed=1, window=None)
        o.update(prior="ggd" if prior == "ggd" else "uniform", docs=False, padding=False)
        check_route("memeff", {**o, "ssmax": False, "batched_pos": False}, torch.float32)
    assert small_blocks


@pytest.fixture
def far_calls(monkeypatch):
    """Counts the calls whose far region (lags past a T5's horizon) ran as plain causal SDPA, taken
    at the tests' short lengths."""
    monkeypatch.setattr(lag_flash, "FAR_SIDE", 1)
    return counted(monkeypatch, lag_flash.FarRegion, "forward")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("prior", ["t5", "t5_bidirectional"])
@pytest.mark.parametrize(
    "B, H, Hkv, Lq, cache, far",
    [
        (2, 4, 2, 40, 0, True),  # most cells are past the horizon (10, or 5 bidirectional)
        (1, 2, 1, 20, -2, True),  # a prefill whose cached keys are nearer than the horizon
        (1, 2, 2, 20, 1, False),  # a cache longer than the horizon: not one causal triangle
        (1, 2, 2, 0, 0, False),  # queries as many as the horizon: none reaches it
    ],
)
def test_a_table_constant_past_a_horizon_runs_its_far_lags_as_causal_sdpa(
    dtype, prior, B, H, Hkv, Lq, cache, far, small_blocks, far_calls
):
    """T5 (random biases): forward and backward, its biases' gradients included, against the float64
    reference, with the far region as one causal kernel call where the masking allows it. ``Lq`` 0:
    the horizon; ``cache``: cached keys before the queries, past the horizon (0: none)."""
    horizon = make_prior(prior, H).constant_beyond()
    Lq = Lq or horizon
    Lk = Lq + (cache and horizon + cache)
    o = dict(B=B, H=H, Hkv=Hkv, Lq=Lq, Lk=Lk, Dk=8, Dv=8, causal=True, offset=0, seed=3, window=None)
    o.update(prior=prior, docs=False, padding=False, ssmax=False, batched_pos=False)
    check_route("memeff", o, dtype)
    assert small_blocks and bool(far_calls) == far


@pytest.mark.parametrize("far_bias", [8.0, -8.0])
def test_the_far_region_is_exact_where_it_holds_the_weight_or_none(far_bias, far_calls):
    """The last bucket far above the others (the far keys hold nearly all of each row's weight) or
    far below (nearly none): outputs and every gradient equal the reference's in float64."""
    prior = T5Bias(2, num_buckets=8, max_distance=12).double()
    with torch.no_grad():
        prior.bias.uniform_(-1, 1)
        prior.bias[:, -1] = far_bias
    q, k, v = (torch.randn(2, 2, 50, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    weights = torch.randn(2, 2, 50, 8, dtype=torch.float64)
    results = []
    for backend in ("memeff", "reference"):
        out = priorattn.attention(q, k, v, prior=prior, causal=True, backend=backend)
        results.append((out, *torch.autograd.grad((out * weights).sum(), (q, k, v, prior.bias))))
    assert len(far_calls) == 1
    for got, expected in zip(*results):
        assert torch.allclose(got, expected, rtol=1e-9, atol=1e-11)


def test_far_region_only_under_plain_causal_masking(far_calls):
    """A window, bidirectional attention, or no horizon: no far region."""
    q_pos = k_pos = torch.arange(30)[None]
    causal = Masking(True, q_pos, k_pos)
    assert lag_flash.far_region(5, causal, 30) == lag_flash.FarRegion(first=5, index=5 + 29, horizon=5)
    assert lag_flash.far_region(None, causal, 30) is None
    assert lag_flash.far_region(5, Masking(False, q_pos, k_pos), 30) is None
    assert lag_flash.far_region(5, Masking(True, q_pos, k_pos, window=10), 30) is None


def test_the_far_region_waits_for_a_triangle_of_far_side_horizons():
    """T5's default horizon (113): from 16 horizons of far queries on."""
    horizon = T5Bias(2).constant_beyond()
    side = lag_flash.FAR_SIDE * horizon
    for Lq, far in [(horizon + side - 1, False), (horizon + side, True), (4096, True), (256, False)]:
        masking = Masking(True, torch.arange(Lq)[None], torch.arange(Lq)[None])
        assert (lag_flash.far_region(horizon, masking, Lq) is not None) == far, Lq


@pytest.mark.parametrize("B, H, Hkv, L", [(16, 4, 4, 40), (3, 6, 2, 300), (1, 4, 1, 700)])
def test_flash_path_tiles_many_heads_at_once_on_short_rows(B, H, Hkv, L):
    """Short rows share a tile among heads (whole batch rows of them, or part of one row's heads);
    long rows take one head per tile."""
    o = dict(B=B, H=H, Hkv=Hkv, Lq=L, Lk=L, Dk=8, Dv=8, causal=True, offset=0, seed=2, window=None)
    o.update(prior="ggd", docs=False, padding=False, ssmax=False, batched_pos=False)
    check_route("memeff", o, torch.float32)


@pytest.mark.parametrize("prior, kernel", [(None, True), (GGD(2, init="alibi", trainable=()), False)])
def test_flash_path_backward_without_a_prior_is_the_kernels(prior, kernel, monkeypatch):
    """No prior: the kernel's own backward. A frozen prior: the tiles (the kernel's backward is slow on
    the subnormal weights a decaying bias makes). Both match the reference."""
    used = []
    kernel_backward = lag_flash.kernel_backward
    monkeypatch.setattr(lag_flash, "kernel_backward", lambda *a: used.append(1) or kernel_backward(*a))
    q, k, v = (torch.randn(1, 2, 50, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    grads = []
    for backend in ("memeff", "reference"):
        out = priorattn.attention(q, k, v, prior=prior, backend=backend)
        grads.append(torch.autograd.grad(out.sum(), (q, k, v)))
    assert bool(used) == kernel
    for got, expected in zip(*grads):
        assert torch.allclose(got, expected, atol=1e-10)


def test_empty_rows_get_zeros_and_finite_gradients():
    """A row whose every visible logit is -inf: zero output, and finite q/k/v gradients equal to the
    reference's (the prior's own parameters get 0 * inf = NaN from its formula, in both routes)."""
    prior = GGD(1, trainable=("alpha", "beta", "mu"))
    with torch.no_grad():
        prior.theta_beta.fill_(-8.0)  # b at lag 0 overflows to -inf: the first query sees only -inf
    q, k, v = (torch.randn(1, 1, 6, 4, requires_grad=True) for _ in range(3))
    results = []
    for backend in ("memeff", "reference"):
        out = priorattn.attention(q, k, v, prior=prior, backend=backend)
        results.append((out, *torch.autograd.grad(out.sum(), (q, k, v))))
    assert (results[0][0][0, 0, 0] == 0).all()
    for got, expected in zip(*results):
        assert torch.isfinite(got).all() and torch.allclose(got, expected, atol=1e-5)


def test_masked_table_hides_future_and_far_lags():
    masking = Masking(True, torch.arange(2, 5)[None], torch.arange(5)[None], window=2)
    table = masked_table(torch.arange(7.0)[None], masking, torch.float32)  # lags -2 .. 4
    inf = float("-inf")
    assert table.tolist() == [[inf, inf, 2.0, 3.0, inf, inf, inf]]
    assert masked_table(None, masking, torch.float32).tolist() == [[inf, inf, 0.0, 0.0, inf, inf, inf]]


def test_empty_rows_are_rows_whose_table_window_is_all_minus_infinity():
    inf = float("-inf")
    table = torch.tensor([[inf, inf, 1.0, inf, inf], [0.0] * 5])  # Lq = 3, Lk = 3
    assert empty_rows(table, 3) is None  # each row of head 0 reads the 1.0
    table[0, 1] = 1.0
    table[0, 2] = inf
    assert empty_rows(table, 3).tolist() == [[False, False, True], [False, False, False]]


@pytest.mark.parametrize("n, m", [(1, 1), (3, 5), (5, 3), (4, 4)])
def test_anti_diagonal_sums_add_each_anti_diagonal(n, m):
    x = torch.randn(2, n, m, dtype=torch.float64)
    flipped = x.flip(-1)
    expected = [
        [torch.diagonal(flipped[h], offset=m - 1 - c).sum() for c in range(n + m - 1)] for h in range(2)
    ]
    assert torch.allclose(anti_diagonal_sums(x), torch.tensor(expected, dtype=torch.float64))
    padded = torch.cat([x, torch.zeros(2, n, n, dtype=torch.float64)], dim=-1)
    assert torch.equal(shifted_row_sums(padded), anti_diagonal_sums(x))


def test_weights_below_the_subnormal_cutoff_change_nothing_visible():
    """The tiles take weights below sqrt(finfo.tiny) as 0: with a steep prior most weights of a long
    row are there, and the gradients still match the float64 reference to float32 precision."""
    prior = GGD(2, init="alibi", trainable=("alpha", "beta", "mu"))
    with torch.no_grad():
        prior.theta_alpha.fill_(math.log(3.0))  # bias ~ -3 |lag|: exp(-43.7) is reached at lag ~15
    q, k, v = (torch.randn(1, 2, 200, 8, dtype=torch.float64) for _ in range(3))
    leaves32 = [t.float().requires_grad_() for t in (q, k, v)]
    out32 = priorattn.attention(*leaves32, prior=prior, backend="memeff")
    prior64 = GGD(2, init="alibi", trainable=("alpha", "beta", "mu")).double()
    prior64.load_state_dict(prior.state_dict())
    leaves64 = [t.requires_grad_() for t in (q, k, v)]
    out64 = priorattn.attention(*leaves64, prior=prior64, backend="reference")
    weights = torch.linspace(-1, 1, out64.numel(), dtype=torch.float64).view_as(out64)
    g32 = torch.autograd.grad((out32.double() * weights).sum(), [*leaves32, *prior.parameters()])
    g64 = torch.autograd.grad((out64 * weights).sum(), [*leaves64, *prior64.parameters()])
    for got, expected in zip(g32, g64):
        assert torch.allclose(got.double(), expected, rtol=1e-4, atol=1e-5 * (expected.abs().max() + 1))


@settings(max_examples=60, deadline=None)
@given(
    Lk=st.integers(1, 40),
    rows_short=st.integers(0, 39),
    step=st.integers(1, 12),
    causal=st.booleans(),
    window=st.sampled_from([None, 3]),
    prior=st.sampled_from(["alibi", "ggd", "ggd_negative"]),
    Hkv=st.integers(1, 2),
    seed=st.integers(0, 2**16),
)
def test_weight_bands_hold_every_key_whose_weight_reaches_the_cutoff(
    Lk, rows_short, step, causal, window, prior, Hkv, seed
):
    """Each (block, head) is in at most one band, and every key whose weight (float64, dense) is at
    least exp(smallest_log_weight(float32)) lies in it: what the bands leave out is below that."""
    Lq, H = max(1, Lk - rows_short), 2 * Hkv
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, H, Lq, 8, generator=gen, dtype=torch.float64) * 2
    k = torch.randn(2, Hkv, Lk, 8, generator=gen, dtype=torch.float64)
    k_pos = torch.arange(Lk)[None]
    masking = Masking(causal, k_pos[:, Lk - Lq :], k_pos, window=window)
    table = masked_table(lag_table(make_prior(prior, H, seed), masking), masking, torch.float64)
    cutoff = smallest_log_weight(torch.float32)
    bands = weight_bands(key_blocks(masking, None, step), table, content_reach(q, k), cutoff)
    lags = torch.arange(Lq)[:, None] - torch.arange(Lk)[None] + Lk - 1
    logits = q @ k.repeat_interleave(2, dim=1).mT + table[:, lags]
    weights = torch.softmax(logits, -1).nan_to_num()  # rows that see no key: 0
    needed = weights >= math.exp(cutoff)
    covered = torch.zeros(2, H, Lq, Lk, dtype=torch.long)
    for rows, heads, cols in bands:
        covered[:, heads, rows, cols] += 1
    assert covered.max() <= 1
    assert not (needed & (covered == 0)).any()


def test_a_steep_prior_skips_the_keys_it_gives_no_weight(monkeypatch):
    """GGD at slopes 1 and 1/2: weights fall below exp(-43.7) within about a hundred lags, so the
    kernel computes about L x 100 cells per head instead of L^2 / 2, forward and backward, and the
    output and gradients still match the reference."""
    cells = []
    kernel = lag_flash.flash

    def counted(q, k, *args, **kwargs):
        cells.append(q.shape[1] * q.shape[2] * k.shape[2])
        return kernel(q, k, *args, **kwargs)

    monkeypatch.setattr(lag_flash, "flash", counted)
    prior = GGD(2, init="alibi")
    with torch.no_grad():
        prior.theta_alpha.copy_(torch.tensor([1.0, 0.5]).log())
    L = 1024
    q, k, v = (torch.randn(1, 2, L, 8, requires_grad=True) for _ in range(3))
    results = []
    for backend in ("memeff", "reference"):
        out = priorattn.attention(q, k, v, prior=prior, backend=backend)
        results.append((out, *torch.autograd.grad(out.sum(), (q, k, v, prior.theta_alpha))))
    assert 0 < sum(cells) <= 2 * L * (256 + 150)
    for got, expected in zip(*results):
        assert torch.allclose(got, expected, atol=1e-4)


def test_a_flat_table_takes_whole_blocks_for_every_head():
    """No lag's bias lies 43.7 below another's: every block is one band of all heads, as given."""
    inf = float("-inf")
    q, k = torch.randn(1, 3, 6, 4) * 100, torch.randn(1, 3, 6, 4) * 100
    blocks = lambda step: ((slice(0, 3), slice(0, 3)), (slice(3, 6), slice(0, 6)))  # noqa: E731
    flat = torch.tensor([[inf] * 5 + [-1.0, -30.0, -40.0, -44.0, -44.5, -44.6]])
    assert call_bands(blocks, flat, q, k)(3) == [(r, slice(0, 3), c) for r, c in blocks(3)]
    steep = flat.clone()
    steep[0, -3:] = -1e7  # key 0 of rows 3-5 (lags 3-5): out of reach even for these large norms
    assert call_bands(blocks, steep, q, k)(3)[-1] == (slice(3, 6), slice(0, 3), slice(1, 6))


def test_tiles_take_more_rows_on_long_rows():
    """A quarter of TILE_ROWS on short rows (less of the causal triangle), TILE_ROWS from 8 x TILE_ROWS
    keys a row on, rising in between, and no more than TILE_BUFFER cells of a row's keys."""
    rows = [lag_flash.tile_rows(L, L) for L in (1, 256, 512, 768, 1024, 2048, 4096, 16384)]
    least, full = lag_flash.TILE_ROWS // 4, lag_flash.TILE_ROWS
    assert (least, full, lag_flash.TILE_BUFFER) == (64, 256, 1 << 21)
    assert rows == [least, least, least, 96, 128, full, full, lag_flash.TILE_BUFFER // 16384]
    assert lag_flash.tile_rows(113, 4096) == least  # a T5's near band: 113 keys a row
