"""Token stores: what build writes is what open maps, the cache reuses it, damage is reported."""

from __future__ import annotations

import numpy as np
import pytest

from priorattn.data import ByteTokenizer, Document, TokenStore, cached_store, default_cache_dir
from priorattn.data.store import TOKENS_FILE

TEXTS = {"a": "first document", "b": "ü", "c": "third, the longest document of the three"}


class WideTokenizer(ByteTokenizer):
    """Bytes, but claiming a vocabulary too large for uint16."""

    vocab_size = 70_000


def test_build_then_open_gives_the_concatenated_encodings(documents, tmp_path):
    tokenizer = ByteTokenizer()
    docs = documents(**TEXTS)
    built = TokenStore.build(docs, tokenizer, tmp_path / "store")
    store = TokenStore.open(tmp_path / "store")
    encodings = [tokenizer.encode(text) for text in TEXTS.values()]
    assert store.tokens.tolist() == built.tokens.tolist() == sum(encodings, [])
    assert len(store) == sum(map(len, encodings))
    assert store.doc_starts.tolist() == [0, 14, 16, len(store)]
    assert store.n_docs == 3 and store.meta["documents"] == ["a", "b", "c"]
    assert store.meta["tokenizer"] == tokenizer.to_dict()
    assert not list(tmp_path.glob(".store.*"))  # the temporary build directory is gone


def test_an_empty_document_has_an_empty_range(documents, tmp_path):
    store = TokenStore.build(documents(a="xy", empty="", b="z"), ByteTokenizer(), tmp_path / "s")
    assert store.doc_starts.tolist() == [0, 2, 2, 3]


@pytest.mark.parametrize(("tokenizer", "dtype"), [(ByteTokenizer(), np.uint16), (WideTokenizer(), np.uint32)])
def test_dtype_is_the_smallest_that_holds_the_vocabulary(documents, tmp_path, tokenizer, dtype):
    store = TokenStore.build(documents(**TEXTS), tokenizer, tmp_path / "store")
    assert store.tokens.dtype == dtype and store.meta["dtype"] == np.dtype(dtype).name


def test_build_refuses_an_existing_path(documents, tmp_path):
    with pytest.raises(FileExistsError, match="exists"):
        TokenStore.build(documents(**TEXTS), ByteTokenizer(), tmp_path)


def test_a_failed_build_leaves_nothing_behind(tmp_path):
    def fail():
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        TokenStore.build([Document("broken", fail)], ByteTokenizer(), tmp_path / "store")
    assert list(tmp_path.iterdir()) == []


def test_truncated_tokens_are_reported_as_corrupt(documents, tmp_path):
    TokenStore.build(documents(**TEXTS), ByteTokenizer(), tmp_path / "store")
    tokens = tmp_path / "store" / TOKENS_FILE
    tokens.write_bytes(tokens.read_bytes()[:-3])
    with pytest.raises(ValueError, match=r"corrupt token store.*tokens.bin has \d+ bytes"):
        TokenStore.open(tmp_path / "store")


def test_missing_store_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="no token store"):
        TokenStore.open(tmp_path)


def test_missing_offsets_are_reported_as_corrupt(documents, tmp_path):
    TokenStore.build(documents(**TEXTS), ByteTokenizer(), tmp_path / "store")
    (tmp_path / "store" / "doc_starts.npy").unlink()
    with pytest.raises(ValueError, match="corrupt token store"):
        TokenStore.open(tmp_path / "store")


def test_cache_builds_once_and_reuses(documents, tmp_path):
    first = cached_store(documents(**TEXTS), ByteTokenizer(), tmp_path)
    built_at = (first.path / TOKENS_FILE).stat().st_mtime_ns
    again = cached_store(documents(**TEXTS), ByteTokenizer(), tmp_path)
    assert again.path == first.path
    assert (again.path / TOKENS_FILE).stat().st_mtime_ns == built_at
    assert [p.name for p in tmp_path.iterdir()] == [first.path.name]


def test_cache_key_changes_with_content_name_and_tokenizer(documents, tmp_path):
    key = cached_store(documents(**TEXTS), ByteTokenizer(), tmp_path).path.name
    edited = cached_store(documents(**{**TEXTS, "b": "changed"}), ByteTokenizer(), tmp_path)
    renamed = cached_store(
        documents(**{"z" if k == "a" else k: v for k, v in TEXTS.items()}), ByteTokenizer(), tmp_path
    )
    wide = cached_store(documents(**TEXTS), WideTokenizer(), tmp_path)
    assert len({key, edited.path.name, renamed.path.name, wide.path.name}) == 4
    assert edited.tokens.tolist()[14:21] == list(b"changed")


def test_default_cache_dir_follows_priorattn_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("PRIORATTN_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path / "tokens"
    monkeypatch.delenv("PRIORATTN_CACHE")
    assert default_cache_dir().parts[-3:] == (".cache", "priorattn", "tokens")
