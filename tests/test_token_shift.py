"""TokenShift: h_t = e_t + W e_{t-1}, zero across a document boundary and at a sequence's start, and
the same in chunks through its state as in one call."""

from __future__ import annotations

import pytest
import torch

from priorattn.token_shift import LayerCaches, ShiftState, TokenShift

DOC_IDS = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2], [5, 5, 5, 5, 6, 6, 6, 6]])  # (2, 8)


def random_shift(d: int = 6, seed: int = 0) -> TokenShift:
    shift = TokenShift(d).double()
    with torch.no_grad():
        shift.weight.copy_(
            torch.randn(d, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        )
    return shift


def embeddings(B: int = 2, L: int = 8, d: int = 6) -> torch.Tensor:
    return torch.randn(B, L, d, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


def test_shift_adds_w_times_the_previous_embedding_of_the_same_document():
    shift, e = random_shift(), embeddings()
    h, state = shift(e, DOC_IDS)
    W = shift.weight
    for b in range(2):
        for t in range(8):
            follows = t > 0 and DOC_IDS[b, t] == DOC_IDS[b, t - 1]
            expected = e[b, t] + (W @ e[b, t - 1] if follows else 0.0)
            torch.testing.assert_close(h[b, t], expected, rtol=0, atol=1e-12)
    assert torch.equal(state.embedding, e[:, -1]) and torch.equal(state.doc_ids, DOC_IDS[:, -1])


def test_without_doc_ids_only_the_first_token_has_no_predecessor():
    shift, e = random_shift(), embeddings()
    h, state = shift(e)
    torch.testing.assert_close(h[:, 0], e[:, 0], rtol=0, atol=0)
    torch.testing.assert_close(h[:, 1:], e[:, 1:] + e[:, :-1] @ shift.weight.T, rtol=0, atol=1e-12)
    assert state.doc_ids is None


@pytest.mark.parametrize("splits", [[1, 2, 3, 4, 5, 6, 7], [3, 5], [4]])
@pytest.mark.parametrize("with_doc_ids", [True, False])
def test_chunks_through_the_state_equal_one_call(splits, with_doc_ids):
    """Chunk starts at 3 and 5 fall on document boundaries of row 0, 4 on one of row 1: there the
    state's document, not its embedding, decides."""
    shift, e = random_shift(), embeddings()
    doc_ids = DOC_IDS if with_doc_ids else None
    whole, _ = shift(e, doc_ids)
    state, parts = None, []
    for start, stop in zip([0, *splits], [*splits, 8]):
        h, state = shift(e[:, start:stop], None if doc_ids is None else doc_ids[:, start:stop], state)
        parts.append(h)
    torch.testing.assert_close(torch.cat(parts, dim=1), whole, rtol=0, atol=1e-12)


def test_a_new_shift_is_the_identity():
    e = embeddings()
    h, _ = TokenShift(6).double()(e, DOC_IDS)
    assert torch.equal(h, e)


def test_doc_ids_on_some_calls_only_are_refused():
    shift, e = random_shift(), embeddings()
    _, with_docs = shift(e, DOC_IDS)
    _, without = shift(e)
    with pytest.raises(ValueError, match="state has doc_ids but this call gives none: pass doc_ids on every"):
        shift(e, None, with_docs)
    with pytest.raises(ValueError, match="state has no doc_ids but this call gives some"):
        shift(e, DOC_IDS, without)


def test_layer_caches_are_a_list_with_the_shift_state():
    state = ShiftState(torch.zeros(1, 4), None)
    caches = LayerCaches(["a", "b"], state)
    assert caches == ["a", "b"] and caches.shift is state and LayerCaches().shift is None
