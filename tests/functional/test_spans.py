"""The routes visit only the keys a query can see: one mask-free call per document of a packed
row, bands of queries against the keys a sliding window reaches."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from factories import make_prior

import priorattn
from priorattn.functional import lag_flash
from priorattn.functional.masks import Masking
from priorattn.functional.spans import Kind, key_spans, span_calls


def packed_doc_ids(lengths: list[int]) -> torch.Tensor:
    """``(1, sum(lengths))`` document ids of a row packing documents of these lengths."""
    return torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))[None]


@pytest.mark.parametrize("causal", [True, False])
def test_packed_row_is_one_mask_free_call_per_document(causal):
    docs = packed_doc_ids([300, 70, 500, 154])
    pos = torch.arange(docs.shape[1])[None]
    lo, hi = key_spans(Masking(causal, pos, pos, docs, docs))
    calls = span_calls(lo[0], hi[0], None, None, None, 1 << 22)
    starts = [0, 300, 370, 870, 1024]
    assert [(c.rows.start, c.rows.stop, c.cols.start, c.cols.stop) for c in calls] == [
        (a, b, a, b) for a, b in zip(starts, starts[1:])
    ]
    assert all(c.kind is (Kind.CAUSAL if causal else Kind.FULL) and c.mask is None for c in calls)


def test_window_bands_cover_exactly_the_visible_keys():
    L, window = 1000, 100
    pos = torch.arange(L)[None]
    masking = Masking(True, pos, pos, window=window)
    lo, hi = key_spans(masking)
    calls = span_calls(lo[0], hi[0], None, window, None, 1 << 22)
    visible = torch.zeros(L, L, dtype=torch.bool)
    for c in calls:
        block = torch.ones(c.rows.stop - c.rows.start, c.cols.stop - c.cols.start, dtype=torch.bool)
        if c.kind is Kind.CAUSAL:
            block = block.tril(block.shape[1] - block.shape[0])
        elif c.kind is Kind.MASKED:
            block = c.mask[0, 0]
        assert not visible[c.rows, c.cols].any(), "calls overlap"
        visible[c.rows, c.cols] = block
        assert (c.rows.stop - c.rows.start) * (c.cols.stop - c.cols.start) <= 128 * (128 + window)
    i, j = torch.arange(L)[:, None], torch.arange(L)[None]
    assert torch.equal(visible, (j <= i) & (i - j < window))


def saved_tensor_sizes(run) -> list[int]:
    sizes = []

    def keep(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        run()
    return sizes


@pytest.mark.parametrize("prior", ["uniform", "goat", "alibi"])
@pytest.mark.parametrize("causal", [True, False])
def test_packed_sdpa_route_saves_no_query_by_key_tensor(prior, causal):
    """Issue 8: a packed row used to hand SDPA a (rows, Lk) mask per chunk, saved for the backward
    (a dense L x L in all). Per-document calls save only O(L) tensors: q', k', v', out, lse."""
    B, H, Hkv, L, D = 2, 4, 2, 1024, 16
    prior = make_prior("goat_noslope" if prior == "goat" and not causal else prior, H, dtype=torch.float32)
    if not prior.can_fold(causal):
        pytest.skip("ALiBi folds only under a causal mask")
    docs = torch.cat([packed_doc_ids([300, 70, 500, 154]), packed_doc_ids([600, 424])])
    q = torch.randn(B, H, L, D, requires_grad=True)
    k, v = (torch.randn(B, Hkv, L, D, requires_grad=True) for _ in range(2))
    sizes = saved_tensor_sizes(
        lambda: priorattn.attention(q, k, v, prior=prior, causal=causal, doc_ids=docs, backend="sdpa")
    )
    width = 2 * D  # the head width plus the fold lanes (fewer than D here)
    assert max(sizes) <= B * H * L * width, f"a saved tensor of {max(sizes)} elements"
    assert sum(sizes) <= 12 * B * H * L * width


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("backend", ["sdpa", "memeff"])
def test_window_routes_visit_only_the_keys_in_reach(backend, causal, monkeypatch):
    """Local attention costs O(L * w): every (query, key) cell a route computes is within reach of
    its band. Before, every query was scored against every key (L^2 cells)."""
    L, window = 2048, 64
    cells = []
    if backend == "sdpa":
        kernel = F.scaled_dot_product_attention

        def counted(q, k, v, **kwargs):
            cells.append(q.shape[2] * k.shape[2])
            return kernel(q, k, v, **kwargs)

        monkeypatch.setattr(F, "scaled_dot_product_attention", counted)
    else:  # no prior, masks on lags only: memeff's flash path, kernel forward and backward

        def counted_cells(kernel, q_at):
            def counted(*args, **kwargs):
                cells.append(args[q_at].shape[2] * args[q_at + 1].shape[2])
                return kernel(*args, **kwargs)

            return counted

        monkeypatch.setattr(lag_flash, "flash", counted_cells(lag_flash.flash, 0))
        monkeypatch.setattr(lag_flash, "flash_backward", counted_cells(lag_flash.flash_backward, 1))
    q = torch.randn(1, 2, L, 8, requires_grad=True)
    out = priorattn.attention(q, q, q, causal=causal, window=window, backend=backend)
    out.sum().backward()
    reach = window if causal else 2 * window
    assert cells and sum(cells) <= 2 * L * (256 + reach)  # forward and backward, bands of <= 256


@pytest.mark.parametrize("backend", ["reference", "sdpa", "memeff"])
def test_queries_that_see_no_key_return_zeros_with_a_zero_gradient(backend):
    """Every query in a document of its own with no keys: the output is zero and still part of the
    graph, so a loss on it backpropagates (zero gradients, or none for inputs no call read)
    instead of raising."""
    q = torch.randn(1, 2, 3, 8, requires_grad=True)
    k = torch.randn(1, 2, 3, 8, requires_grad=True)
    v = torch.randn(1, 2, 3, 8, requires_grad=True)
    doc_ids = (torch.tensor([[5, 6, 7]]), torch.tensor([[1, 2, 3]]))
    out = priorattn.attention(q, k, v, causal=False, doc_ids=doc_ids, backend=backend)
    assert torch.equal(out, torch.zeros_like(out))
    out.sum().backward()
    assert torch.equal(q.grad, torch.zeros_like(q))
    for t in (k, v):
        assert t.grad is None or torch.equal(t.grad, torch.zeros_like(t))


@pytest.mark.parametrize("Lq, Lk", [(5, 5), (3, 9), (1, 4)])
@pytest.mark.parametrize("causal", [True, False])
def test_visible_keys_counted_without_masks_equal_the_masks_count(Lq, Lk, causal):
    masking = Masking(causal, torch.arange(Lk - Lq, Lk)[None], torch.arange(Lk)[None], starts=(Lk - Lq, 0))
    assert torch.equal(masking.visible_keys(), masking.visible().sum(-1)[:, 0])
