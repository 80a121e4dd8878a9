"""The unigram baseline, against the formula written out by hand."""

from __future__ import annotations

import math

import pytest

from priorattn.data import ByteTokenizer, Document, TokenStore, stats, unigram_cross_entropy


def byte_store(text: str, path):
    return TokenStore.build([Document("only", lambda: text)], ByteTokenizer(), path)


def test_unigram_cross_entropy_by_hand(tmp_path):
    train = byte_store("\x00\x00\x01", tmp_path / "train")
    val = byte_store("\x01\x02", tmp_path / "val")
    # add-one smoothing over V = 4: p(0) = 3/7, p(1) = 2/7, p(2) = 1/7, p(3) = 1/7
    expected = -(math.log(2 / 7) + math.log(1 / 7)) / 2
    assert unigram_cross_entropy(train, val, 4) == pytest.approx(expected)


def test_counting_in_chunks_changes_nothing(tmp_path, monkeypatch):
    train = byte_store("the quick brown fox jumps over the lazy dog", tmp_path / "train")
    val = byte_store("pack my box with five dozen liquor jugs", tmp_path / "val")
    whole = unigram_cross_entropy(train, val, 256)
    monkeypatch.setattr(stats, "CHUNK", 5)
    assert unigram_cross_entropy(train, val, 256) == pytest.approx(whole)


def test_token_outside_the_vocabulary_is_an_error(tmp_path):
    store = byte_store("abc", tmp_path / "s")
    with pytest.raises(ValueError, match="token id 99 >= vocab_size=4"):
        unigram_cross_entropy(store, store, 4)
