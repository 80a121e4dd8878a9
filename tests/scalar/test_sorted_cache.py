"""The sorted scalar-key cache against dense attention over the same tokens (seed 002 decoding)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from priorattn.scalar.sorted_cache import (
    DensityMerge,
    GeometricEviction,
    SortedScalarCache,
    scalar_attention_reference,
)

F64 = torch.float64

#: (H, Hk, G): per-head sorting, per-head sorting over grouped values, one sort head per group.
LAYOUTS = [(2, 2, 2), (4, 4, 2), (4, 2, 2), (6, 3, 1)]


def tokens(n: int, Hk: int, G: int, Dv: int, Dk: int | None, spread: float = 1.0):
    """Scalar keys ``(n, Hk)``, values ``(n, G, Dv)`` and vector keys ``(n, G, Dk)`` (or None)."""
    k_s = (torch.rand(n, Hk, dtype=F64) * 2 - 1) * spread
    v = torch.randn(n, G, Dv, dtype=F64)
    k_vec = None if Dk is None else torch.randn(n, G, Dk, dtype=F64)
    return k_s, v, k_vec


def query(H: int, Dk: int | None, spread: float = 1.0):
    q_s = (torch.rand(H, dtype=F64) * 2 - 1) * spread
    return q_s, None if Dk is None else torch.randn(H, Dk, dtype=F64)


def filled(H, Hk, G, Dv, Dk, k_s, v, k_vec, buffer_size, chunk=3, **options) -> SortedScalarCache:
    """A cache fed ``chunk`` tokens at a time, so entries sit both in sorted arrays and in buffers."""
    cache = SortedScalarCache(
        H, G, Dv, num_key_heads=Hk, vector_key_dim=Dk, buffer_size=buffer_size, dtype=F64, **options
    )
    for start in range(0, k_s.shape[0], chunk):
        part = slice(start, start + chunk)
        cache.append(k_s[part], v[part], None if k_vec is None else k_vec[part])
    return cache


def reference(q_s, tau, k_s, v, q_vec=None, k_vec=None):
    return scalar_attention_reference(
        q_s,
        tau,
        k_s.T,
        v.transpose(0, 1),
        q_vec=q_vec,
        k_vec=None if k_vec is None else k_vec.transpose(0, 1),
    )


def outside_mass(q_s, tau, k_s, window, q_vec=None, k_vec=None, H=None):
    """The exact attention mass outside the ``window`` keys nearest each query: ``(H,)``."""
    H = q_s.shape[0]
    Hk, G = k_s.shape[1], None if k_vec is None else k_vec.shape[1]
    keys = k_s.T.repeat_interleave(H // Hk, dim=0)  # (H, n)
    scores = -((q_s[:, None] - keys) ** 2) / torch.as_tensor(tau, dtype=F64).expand(H)[:, None]
    if q_vec is not None:
        vec = k_vec.transpose(0, 1).repeat_interleave(H // G, dim=0)  # (H, n, Dk)
        scores = scores + q_vec.shape[-1] ** -0.5 * torch.einsum("hd,hnd->hn", q_vec, vec)
    weights = torch.softmax(scores, dim=-1)
    nearest = (q_s[:, None] - keys).abs().argsort(dim=1)[:, :window]
    return 1 - weights.gather(1, nearest).sum(dim=1)


layouts = st.sampled_from(LAYOUTS)
hybrid = st.sampled_from([None, 3])


@settings(max_examples=20)
@given(
    layout=layouts, Dk=hybrid, n=st.integers(1, 40), buffer_size=st.integers(1, 16), extra=st.integers(0, 5)
)
def test_window_covering_the_cache_equals_exact_attention(layout, Dk, n, buffer_size, extra):
    H, Hk, G = layout
    k_s, v, k_vec = tokens(n, Hk, G, 5, Dk)
    cache = filled(H, Hk, G, 5, Dk, k_s, v, k_vec, buffer_size)
    q_s, q_vec = query(H, Dk)
    tau = torch.rand(H, dtype=F64) + 0.05
    step = cache.decode(q_s, tau, n + extra, q_vec=q_vec)
    torch.testing.assert_close(step.output, reference(q_s, tau, k_s, v, q_vec, k_vec), rtol=1e-12, atol=1e-12)
    assert step.mass_outside_bound.eq(0).all()
    assert step.rows_read == H * n


@settings(max_examples=40)
@given(
    layout=layouts,
    Dk=hybrid,
    n=st.integers(2, 60),
    buffer_size=st.integers(1, 16),
    window=st.integers(1, 20),
    log_tau=st.floats(-4, 1),
)
def test_mass_bound_is_an_upper_bound_on_the_exact_outside_mass(layout, Dk, n, buffer_size, window, log_tau):
    H, Hk, G = layout
    k_s, v, k_vec = tokens(n, Hk, G, 4, Dk)
    cache = filled(H, Hk, G, 4, Dk, k_s, v, k_vec, buffer_size)
    q_s, q_vec = query(H, Dk, spread=1.2)
    tau = math.exp(log_tau)
    exact = reference(q_s, tau, k_s, v, q_vec, k_vec)
    # With entries in the append buffer the window also holds all of them: the output misses at
    # most the bound times the spread of the values.
    step = cache.decode(q_s, tau, window, q_vec=q_vec)
    assert (
        (step.output - exact).abs().max(dim=1).values <= 2 * step.mass_outside_bound * v.abs().max() + 1e-12
    ).all()
    # Once every entry is sorted the window is exactly the `window` nearest keys.
    cache.flush()
    step = cache.decode(q_s, tau, window, q_vec=q_vec)
    exact_outside = outside_mass(q_s, tau, k_s, window, q_vec, k_vec)
    assert (exact_outside <= step.mass_outside_bound + 1e-12).all()
    error = (step.output - exact).abs().max(dim=1).values
    assert (error <= 2 * exact_outside * v.abs().max() + 1e-12).all()


@pytest.mark.parametrize("tau, window", [(1e-3, 64), (1e-3, 256), (1e-4, 64), (1e-5, 64)])
def test_mass_bound_is_close_to_the_exact_outside_mass(tau, window):
    # 20000 keys spread over [-3, 3]: the doubling blocks beyond the window keep the bound within
    # 1.5x of the truth, where (outside count) x (largest outside weight) would exceed it 100-fold.
    k_s, v, _ = tokens(20000, 1, 1, 4, None, spread=3.0)
    cache = filled(1, 1, 1, 4, None, k_s, v, None, buffer_size=256, chunk=20000)
    q = torch.tensor([0.3], dtype=F64)
    exact_outside = outside_mass(q, tau, k_s, window)
    bound = cache.decode(q, tau, window).mass_outside_bound
    assert exact_outside - 1e-12 <= bound <= 1.5 * exact_outside


@pytest.mark.parametrize("Dk", [None, 4], ids=["scalar", "hybrid"])
@pytest.mark.parametrize("layout", LAYOUTS[1:3], ids=["per-head", "sort-head"])
def test_step_by_step_decoding_matches_full_causal_attention_within_the_bound(layout, Dk):
    H, Hk, G = layout
    T, Dv, window, tau = 300, 6, 12, 2e-3
    k_s, v, k_vec = tokens(T, Hk, G, Dv, Dk, spread=2.0)
    q_s = (torch.rand(T, H, dtype=F64) * 2 - 1) * 2.0
    q_vec = None if Dk is None else torch.randn(T, H, Dk, dtype=F64)
    # The full pass: every query against every earlier key, one causal softmax.
    scores = -((q_s.T[:, :, None] - k_s.T.repeat_interleave(H // Hk, 0)[:, None, :]) ** 2) / tau  # (H, T, T)
    if Dk is not None:
        vec = k_vec.transpose(0, 1).repeat_interleave(H // G, 0)  # (H, T, Dk)
        scores = scores + Dk**-0.5 * q_vec.transpose(0, 1) @ vec.transpose(1, 2)
    scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), -math.inf)
    full = torch.softmax(scores, -1) @ v.transpose(0, 1).repeat_interleave(H // G, 0)  # (H, T, Dv)

    cache = SortedScalarCache(H, G, Dv, num_key_heads=Hk, vector_key_dim=Dk, buffer_size=16, dtype=F64)
    bounds = []
    for t in range(T):
        cache.append(k_s[t], v[t], None if Dk is None else k_vec[t])
        step = cache.decode(q_s[t], tau, window, q_vec=None if Dk is None else q_vec[t])
        error = (step.output - full[:, t]).abs().max(dim=1).values
        assert (error <= 2 * step.mass_outside_bound * v.abs().max() + 1e-12).all(), t
        bounds.append(step.mass_outside_bound)
    # The bound is informative, not vacuous: most steps hold nearly all the mass in 12 keys.
    assert torch.stack(bounds).median() < 1e-3


@settings(max_examples=30)
@given(
    layout=layouts,
    n=st.integers(1, 30),
    buffer_size=st.integers(1, 8),
    seed=st.integers(0, 2**16),
    chunk=st.integers(1, 7),
)
def test_cache_is_invariant_to_insertion_order(layout, n, buffer_size, seed, chunk):
    H, Hk, G = layout
    # Keys on a coarse grid so that equal keys (ties) are common.
    k_s = torch.randint(-3, 4, (n, Hk)).to(F64) / 2
    v = torch.randn(n, G, 3, dtype=F64)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    in_order = filled(H, Hk, G, 3, None, k_s, v, None, buffer_size)
    shuffled = SortedScalarCache(H, G, 3, num_key_heads=Hk, buffer_size=buffer_size, dtype=F64)
    for start in range(0, n, chunk):
        picked = order[start : start + chunk]
        shuffled.append(k_s[picked], v[picked], positions=picked)
    in_order.flush()
    shuffled.flush()
    for h in range(Hk):
        for a, b in zip(in_order.entries(h), shuffled.entries(h)):
            assert torch.equal(a, b)
    q_s = torch.randint(-3, 4, (H,)).to(F64) / 2
    for window in (1, 3, n):
        assert torch.equal(in_order.decode(q_s, 0.3, window).output, shuffled.decode(q_s, 0.3, window).output)


def test_a_step_reads_log_n_plus_window_plus_buffer_keys_not_n():
    n, window, buffer_size = 64 * 78, 16, 64
    k_s, v, _ = tokens(n + 10, 2, 1, 4, None)
    cache = filled(2, 2, 1, 4, None, k_s[:n], v[:n], None, buffer_size, chunk=n)  # one bulk merge
    cache.append(k_s[n:], v[n:])  # 10 tokens left in the buffer
    step = cache.decode(torch.zeros(2, dtype=F64), 0.1, window)
    search, probes = math.ceil(math.log2(n + 1)), 2 * math.ceil(math.log2(n / window + 1))
    per_head = search + 2 * window + 10 + probes
    assert step.keys_read == 2 * per_head
    assert step.rows_read == 2 * (window + 10)  # the window's sorted entries and the whole buffer


def test_a_buffer_merged_run_by_run_in_place_sorts_as_one_bulk_merge():
    # 2048 entries, buffers of 8: each merge moves the old entries run by run (8 x 256 <= 2048) in
    # place, into the arrays' padding (no allocation); keys on a coarse grid, so ties abound.
    n, buffer_size, more = 2048, 8, 40
    k_s = torch.randint(-20, 21, (n + more, 2)).to(F64) / 4
    v = torch.randn(n + more, 2, 3, dtype=F64)
    cache = SortedScalarCache(2, 2, 3, buffer_size=buffer_size, dtype=F64)
    cache.append(k_s[:n], v[:n])
    pointers = set()
    for t in range(n, n + more):
        cache.append(k_s[t], v[t])
        pointers.add(cache._packed.keys.data_ptr())
    assert len(pointers) == 1  # the prefill's arrays, with room for 1.25 x 2048 entries
    bulk = SortedScalarCache(2, 2, 3, buffer_size=buffer_size, dtype=F64)
    bulk.append(k_s, v)
    for h in range(2):
        for a, b in zip(cache.entries(h), bulk.entries(h)):
            assert torch.equal(a, b)
    q_s = torch.tensor([0.25, -1.0], dtype=F64)
    for window in (1, 16, n + more):
        torch.testing.assert_close(
            cache.decode(q_s, 0.1, window).output, bulk.decode(q_s, 0.1, window).output
        )
    torch.testing.assert_close(cache.decode(q_s, 0.1, n + more).output, reference(q_s, 0.1, k_s, v))


def test_geometric_eviction_keeps_the_range_of_recent_queries_and_the_sink_zone():
    n = 2000
    k_s, v, _ = tokens(n, 1, 1, 4, None, spread=10.0)
    policy = GeometricEviction(recent=8, margin=2.0)
    cache = filled(1, 1, 1, 4, None, k_s, v, None, buffer_size=64, eviction=policy, sink_zone=(8.0, 9.0))
    for q in [-1.0, 0.5, 1.0, 0.0]:
        cache.decode(torch.tensor([q], dtype=F64), 0.1, 8)
    before = cache.nbytes()
    cache.flush()
    keys, positions, _, values = cache.entries(0)
    kept = ((k_s[:, 0] >= -3) & (k_s[:, 0] <= 3)) | ((k_s[:, 0] >= 8) & (k_s[:, 0] <= 9))
    assert torch.equal(positions.sort().values, torch.nonzero(kept).flatten())
    assert torch.equal(values, v[positions, 0])
    assert cache.nbytes() < before / 2  # evicted rows are released, not only unlinked
    # Decoding now is exact attention over what is left, and its bound counts only what is left.
    q = torch.tensor([0.7], dtype=F64)
    torch.testing.assert_close(cache.decode(q, 0.1, n).output, reference(q, 0.1, k_s[kept], v[kept]))
    step = cache.decode(q, 0.1, 16)
    exact_outside = outside_mass(q, 0.1, k_s[kept], 16)
    assert (exact_outside <= step.mass_outside_bound + 1e-12).all()


def test_geometric_eviction_forgets_queries_older_than_recent():
    k_s, v, _ = tokens(500, 1, 1, 2, None, spread=10.0)
    cache = filled(1, 1, 1, 2, None, k_s, v, None, 1024, eviction=GeometricEviction(recent=2, margin=0.5))
    for q in [-9.0, 4.0, 5.0]:  # -9 has left the ring of the last two queries
        cache.decode(torch.tensor([q], dtype=F64), 0.1, 4)
    cache.flush()
    keys = cache.entries(0)[0]
    assert keys.min() >= 3.5 and keys.max() <= 5.5
    assert len(keys) == int(((k_s >= 3.5) & (k_s <= 5.5)).sum())


@pytest.mark.parametrize("Dk", [None, 3], ids=["scalar", "hybrid"])
def test_density_merge_of_equal_keys_is_exact_and_keeps_their_weight(Dk):
    # 40 distinct keys (one per bin of width 0.1), each held by 1 to 5 tokens with equal vector keys:
    # merging a bin is then exact, provided the merged entry keeps its count in the softmax.
    centres = torch.linspace(-1.95, 1.95, 40, dtype=F64)
    copies = torch.randint(1, 6, (40,))
    k_s = centres.repeat_interleave(copies)[:, None]
    n = k_s.shape[0]
    v = torch.randn(n, 1, 4, dtype=F64)
    k_vec = None if Dk is None else torch.randn(40, 1, Dk, dtype=F64).repeat_interleave(copies, 0)
    merge = DensityMerge(width=0.1, max_entries=10)
    cache = filled(1, 1, 1, 4, Dk, k_s, v, k_vec, buffer_size=8, merge=merge, sink_zone=(-0.01, 0.01))
    cache.flush()
    assert len(cache) == 40
    q_s, q_vec = query(1, Dk)
    tau = 0.05
    torch.testing.assert_close(
        cache.decode(q_s, tau, 40, q_vec=q_vec).output, reference(q_s, tau, k_s, v, q_vec, k_vec)
    )
    step = cache.decode(q_s, tau, 5, q_vec=q_vec)
    exact_outside = outside_mass(
        q_s, tau, k_s, int(copies[(centres - q_s).abs().argsort()[:5]].sum()), q_vec, k_vec
    )
    assert (exact_outside <= step.mass_outside_bound + 1e-12).all()


@pytest.mark.parametrize("Dk", [None, 3], ids=["scalar", "hybrid"])
def test_groups_of_different_lengths_decode_as_dense_attention(Dk):
    # Density merging acts on group 0 only (its keys crowd into a few bins), so the groups' row
    # tables, one (G, capacity) storage, grow apart; later tokens go to each group at its own end.
    n = 60
    k_s, v, k_vec = tokens(n + 7, 2, 2, 4, Dk)
    k_s[:n, 0] = torch.randint(0, 3, (n,)).to(F64) / 10 + 0.05  # 3 distinct keys, at bin centres
    k_s[:, 1] = torch.randperm(n + 7).to(F64)  # one key per bin: nothing to merge
    merge = DensityMerge(width=0.1, max_entries=2)
    cache = filled(2, 2, 2, 4, Dk, k_s[:n], v[:n], None if Dk is None else k_vec[:n], 8, merge=merge)
    cache.flush()
    assert len(cache.entries(0)[0]) == 3 and len(cache.entries(1)[0]) == n
    cache.append(k_s[n:], v[n:], None if Dk is None else k_vec[n:])  # 7 tokens, in the buffer
    q_s, q_vec = query(2, Dk)
    dense = cache.dense_decode(q_s, 0.2, q_vec=q_vec)
    torch.testing.assert_close(cache.decode(q_s, 0.2, n, q_vec=q_vec).output, dense)
    # Merging equal keys is exact (same key, mean value, summed count), so dense decoding of the
    # merged cache is attention over the tokens themselves, up to the vector keys it averaged.
    if Dk is None:
        torch.testing.assert_close(dense, reference(q_s, 0.2, k_s, v))


def test_rows_are_laid_out_in_key_order_whenever_a_table_doubles():
    # One key head per group: after a relayout its sorted entries point to rows 0, 1, 2, ... (the
    # window's rows are one contiguous run); tokens arriving later sit in arrival order until the
    # table has doubled again.
    k_s, v, _ = tokens(200, 2, 2, 3, None)
    cache = SortedScalarCache(2, 2, 3, buffer_size=4, dtype=F64)

    def laid_out(n):
        return all(torch.equal(cache._orders[h].rows, torch.arange(n, dtype=torch.int32)) for h in range(2))

    cache.append(k_s[:100], v[:100])  # a prefill: the table doubled from empty
    assert laid_out(100)
    cache.append(k_s[100:148], v[100:148])  # merged at once: 148 rows < 2 x 100
    cache.flush()
    assert len(cache) == 148 and not laid_out(148)
    cache.append(k_s[148:200], v[148:200])
    cache.flush()  # 200 rows: doubled since the prefill
    assert laid_out(200)
    q_s, _ = query(2, None)
    torch.testing.assert_close(cache.decode(q_s, 0.3, 200).output, reference(q_s, 0.3, k_s, v))
    for h in range(2):  # the entries themselves did not move
        keys, positions, _, values = cache.entries(h)
        assert torch.equal(keys, k_s[positions, h]) and torch.equal(values, v[positions, h])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_every_dtype_sorts_like_float64(dtype):
    # Keys on a grid every dtype holds exactly, with ties: the merge moves raw bits, so each dtype
    # must give float64's order (key, then position), through bulk and buffered merges alike.
    k_s = torch.randint(-8, 9, (200, 2)).to(F64) / 4
    v = torch.randn(200, 1, 2, dtype=F64)
    caches = []
    for kind in (F64, dtype):
        cache = SortedScalarCache(2, 1, 2, num_key_heads=2, buffer_size=16, dtype=kind)
        cache.append(k_s[:120], v[:120])
        for t in range(120, 200):
            cache.append(k_s[t], v[t])
        cache.flush()
        caches.append(cache)
    for h in range(2):
        keys, positions, _, _ = caches[0].entries(h)
        other_keys, other_positions, _, _ = caches[1].entries(h)
        assert torch.equal(other_keys.to(F64), keys) and torch.equal(other_positions, positions)


def test_density_merge_spares_the_sink_zone_and_merges_only_above_max_entries():
    k_s = torch.tensor([[-0.52], [-0.51], [0.01], [0.02], [0.31], [0.32]], dtype=F64)
    v = torch.randn(6, 1, 2, dtype=F64)
    small = filled(1, 1, 1, 2, None, k_s, v, None, 8, merge=DensityMerge(width=0.1, max_entries=6))
    small.flush()
    assert len(small) == 6
    cache = filled(
        1, 1, 1, 2, None, k_s, v, None, 8, merge=DensityMerge(width=0.1, max_entries=5), sink_zone=(0.0, 0.05)
    )
    cache.flush()
    keys, _, log_count, values = cache.entries(0)
    torch.testing.assert_close(keys, torch.tensor([-0.515, 0.01, 0.02, 0.315], dtype=F64))
    torch.testing.assert_close(log_count.exp(), torch.tensor([2.0, 1, 1, 2], dtype=F64))
    torch.testing.assert_close(values[0], v[:2, 0].mean(0))


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: SortedScalarCache(4, 3, 2), "num_groups=3 does not divide"),
        (lambda: SortedScalarCache(4, 2, 2, num_key_heads=3), "num_key_heads=3 does not divide num_heads=4"),
        (lambda: SortedScalarCache(4, 2, 0), "value_dim must be an int >= 1"),
        (lambda: SortedScalarCache(4, 2, 2, buffer_size=0), "buffer_size must be an int >= 1"),
        (lambda: SortedScalarCache(2, 1, 2, sink_zone=(1.0, 0.0)), "sink_zone must be a finite range"),
        (lambda: DensityMerge(width=0.0, max_entries=4), "DensityMerge.width must be finite and > 0"),
        (lambda: GeometricEviction(recent=0), "GeometricEviction.recent must be an int >= 1"),
    ],
)
def test_bad_configuration_is_a_clear_error(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def cache_of_two():
    cache = SortedScalarCache(2, 1, 3, dtype=F64)
    cache.append(torch.randn(5, 2, dtype=F64), torch.randn(5, 1, 3, dtype=F64))
    return cache


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda c: c.decode(torch.zeros(2), 0.0, 4), "tau must be finite and > 0"),
        (lambda c: c.decode(torch.zeros(2), torch.tensor([0.1, -1.0]), 4), "tau must be finite and > 0"),
        (lambda c: c.decode(torch.zeros(2), float("nan"), 4), "tau must be finite and > 0"),
        (lambda c: c.decode(torch.zeros(2), 0.1, 0), "window must be an int >= 1"),
        (lambda c: c.decode(torch.tensor([0.0, math.nan]), 0.1, 4), "q_s has NaN"),
        (lambda c: c.decode(torch.zeros(3), 0.1, 4), r"q_s must be a tensor of shape \(2,\)"),
        (lambda c: c.decode(torch.zeros(2), 0.1, 4, q_vec=torch.zeros(2, 3)), "no vector keys"),
        (lambda c: c.append(torch.tensor([0.0, math.nan]), torch.zeros(1, 3)), "k_s has NaN or infinite"),
        (lambda c: c.append(torch.tensor([0.0, 1.0]), torch.full((1, 3), math.inf)), "v has NaN or infinite"),
        (lambda c: c.append(torch.zeros(3), torch.zeros(1, 3)), r"k_s must have shape \(L, 2\)"),
        (lambda c: c.append(torch.zeros(2), torch.zeros(2, 3)), r"v must have shape \(1, 1, 3\)"),
    ],
)
def test_bad_input_is_a_clear_error(call, message):
    with pytest.raises(ValueError, match=message):
        call(cache_of_two())


def test_decoding_an_empty_cache_is_a_clear_error():
    with pytest.raises(ValueError, match="the cache is empty"):
        SortedScalarCache(2, 1, 3).decode(torch.zeros(2), 0.1, 4)


def test_hybrid_cache_demands_vector_keys_and_queries():
    cache = SortedScalarCache(2, 1, 3, vector_key_dim=4)
    with pytest.raises(ValueError, match=r"needs k_vec of shape \(1, 1, 4\)"):
        cache.append(torch.zeros(2), torch.zeros(1, 3))
    cache.append(torch.zeros(2), torch.zeros(1, 3), torch.zeros(1, 4))
    with pytest.raises(ValueError, match=r"needs q_vec of shape \(2, 4\)"):
        cache.decode(torch.zeros(2), 0.1, 4)


def test_decoding_a_key_head_that_eviction_emptied_is_a_clear_error():
    k_s = torch.tensor([[0.0, 5.0], [0.1, 5.1]], dtype=F64)
    cache = filled(
        2, 2, 1, 2, None, k_s, torch.randn(2, 1, 2, dtype=F64), None, 8, eviction=GeometricEviction(1, 0.5)
    )
    cache.decode(torch.zeros(2, dtype=F64), 0.1, 4)  # key head 1's keys lie 5 away from its query
    cache.flush()
    with pytest.raises(ValueError, match=r"the cache is empty for key heads \[1\]"):
        cache.decode(torch.zeros(2, dtype=F64), 0.1, 4)
