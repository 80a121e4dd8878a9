"""Packed windows against a plain-Python reference, and stateless, resumable, sharded batches."""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from priorattn.data import (
    Batches,
    ByteTokenizer,
    Document,
    PackedSequences,
    TokenStore,
    document_positions,
    eval_batches,
)


def byte_store(texts: list[str], path: Path) -> TokenStore:
    docs = [Document(f"doc{i:03d}", lambda text=text: text) for i, text in enumerate(texts)]
    return TokenStore.build(docs, ByteTokenizer(), path / "store")


def reference_window(texts: list[str], seq_len: int, i: int) -> tuple[list, list, list]:
    """Window ``i`` of the packed stream, token by token."""
    stream = [(byte, d) for d, text in enumerate(texts) for byte in text.encode()]  # (token, document)
    window = stream[i * seq_len : i * seq_len + seq_len + 1]
    tokens = [token for token, _ in window[:-1]]
    doc_ids = [d for _, d in window[:-1]]
    targets = [token if d == doc else -100 for (token, d), doc in zip(window[1:], doc_ids)]
    return tokens, targets, doc_ids


@pytest.fixture
def windows(tmp_path):
    """``windows(n, seq_len)``: packed sequences of exactly ``n`` windows over one document."""
    return lambda n, seq_len=4: PackedSequences(byte_store(["x" * (n * seq_len + 1)], tmp_path), seq_len)


def test_hand_packed_example(tmp_path):
    packed = PackedSequences(byte_store(["abc", "de", "fghij"], tmp_path), 3)
    assert len(packed) == 3  # (10 - 1) // 3
    tokens, targets, doc_ids = packed.batch([0, 1, 2])
    assert tokens.tolist() == [list(b"abc"), list(b"def"), list(b"ghi")]
    assert targets.tolist() == [[*b"bc", -100], [ord("e"), -100, ord("g")], list(b"hij")]
    assert doc_ids.tolist() == [[0, 0, 0], [1, 1, 2], [2, 2, 2]]
    assert tokens.dtype == targets.dtype == doc_ids.dtype == torch.long


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 12), min_size=1, max_size=6).filter(lambda ls: sum(ls) >= 2),
    seq_len=st.integers(1, 9),
    data=st.data(),
)
def test_windows_match_the_reference(lengths, seq_len, data):
    texts = ["".join(chr(97 + (d + k) % 26) for k in range(n)) for d, n in enumerate(lengths)]
    if sum(lengths) < seq_len + 1:
        seq_len = sum(lengths) - 1
    with tempfile.TemporaryDirectory() as tmp:
        packed = PackedSequences(byte_store(texts, Path(tmp)), seq_len)
        assert len(packed) == (sum(lengths) - 1) // seq_len
        indices = data.draw(st.lists(st.integers(0, len(packed) - 1), min_size=1, max_size=4))
        tokens, targets, doc_ids = packed.batch(torch.tensor(indices))
    positions = document_positions(doc_ids).expand(len(indices), -1)
    for row, i in enumerate(indices):
        expected = reference_window(texts, seq_len, i)
        assert (tokens[row].tolist(), targets[row].tolist(), doc_ids[row].tolist()) == expected
        counted = [0]  # position in the document, counted from the window's first token
        for previous, doc in zip(expected[2], expected[2][1:]):
            counted.append(counted[-1] + 1 if doc == previous else 0)
        assert positions[row].tolist() == counted


def test_document_positions_restart_at_each_boundary(tmp_path):
    _, _, doc_ids = PackedSequences(byte_store(["abc", "de", "fghij"], tmp_path), 3).batch([0, 1, 2])
    assert document_positions(doc_ids).tolist() == [[0, 1, 2], [0, 1, 0], [0, 1, 2]]


def test_document_positions_without_a_boundary_are_one_shared_run():
    """Rows of one document each keep positions shared by the batch (attention's fast paths)."""
    positions = document_positions(torch.tensor([[4, 4, 4], [7, 7, 7]]))
    assert positions.shape == (3,) and positions.tolist() == [0, 1, 2]


def test_too_few_tokens_says_what_to_do(tmp_path):
    store = byte_store(["12345"], tmp_path)
    assert len(PackedSequences(store, 4)) == 1
    with pytest.raises(ValueError, match=r"5 tokens, fewer than seq_len \+ 1 = 6: use a shorter --seq-len"):
        PackedSequences(store, 5)


@pytest.mark.parametrize("indices", [[3], [-1], [[0]], [0.5]])
def test_batch_rejects_bad_indices(windows, indices):
    with pytest.raises(ValueError, match="indices"):
        windows(3).batch(indices)


def test_same_step_same_batch_and_seeds_differ(windows):
    packed = windows(50)
    batches = Batches(packed, 8, seed=1)
    assert torch.equal(batches.global_indices(7), Batches(packed, 8, seed=1).global_indices(7))
    assert not torch.equal(batches.global_indices(7), Batches(packed, 8, seed=2).global_indices(7))
    assert all(torch.equal(a, b) for a, b in zip(batches.batch(3), Batches(packed, 8, seed=1).batch(3)))


def test_every_window_once_per_epoch_across_straddling_batches(windows):
    n, batch_size = 10, 3  # batch 3 holds stream positions 9, 10, 11: the end of epoch 0, start of 1
    batches = Batches(windows(n), batch_size, seed=0)
    stream = torch.cat([batches.global_indices(step) for step in range(10)])  # 30 = three epochs
    for epoch in range(3):
        assert sorted(stream[epoch * n : (epoch + 1) * n].tolist()) == list(range(n))
    assert not torch.equal(stream[:n], stream[n : 2 * n])  # a fresh order each epoch


def test_batches_larger_than_the_data_cycle_through_epochs(windows):
    batches = Batches(windows(3), 8, seed=0)
    stream = torch.cat([batches.global_indices(0), batches.global_indices(1)])  # 16 = 5 epochs + 1
    assert Counter(stream.tolist()) == {0: 5, 1: 5, 2: 5} | {stream[15].item(): 6}
    assert batches.batch(1)[0].shape == (8, 4)


def test_rank_shares_interleave_to_the_global_batch(windows):
    packed = windows(40)
    batches = Batches(packed, 12, seed=3)
    tokens, targets, doc_ids = packed.batch(batches.global_indices(5))
    shares = [batches.batch(5, rank, 4) for rank in range(4)]
    for full, part in zip((tokens, targets, doc_ids), zip(*shares)):
        interleaved = torch.stack(part, dim=1).flatten(0, 1)  # rows r, r + 4, ... come from rank r
        assert torch.equal(interleaved, full)


def test_world_size_must_divide_the_batch(windows):
    batches = Batches(windows(10), 6, seed=0)
    with pytest.raises(ValueError, match="world_size.*dividing batch_size=6"):
        batches.batch(0, rank=0, world_size=4)
    with pytest.raises(ValueError, match="rank"):
        batches.batch(0, rank=3, world_size=3)


def test_eval_batches_are_the_first_windows_in_order(windows):
    packed = windows(10)
    batches = list(eval_batches(packed, 4, max_sequences=9))
    assert [len(tokens) for tokens, _, _ in batches] == [4, 4, 1]
    for got, expected in zip(torch.cat([b[0] for b in batches]), packed.batch(range(9))[0]):
        assert torch.equal(got, expected)
    assert sum(len(b[0]) for b in eval_batches(packed, 4)) == 10
