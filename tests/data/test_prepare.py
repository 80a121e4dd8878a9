"""prepare_data end to end: the default corpus into a model, BPE on the train split, resume checks."""

from __future__ import annotations

import json

import pytest
import torch
from test_corpus import SHAKESPEARE_VAL

from priorattn.data import Batches, load_corpus, prepare_data, split_documents, unigram_cross_entropy
from priorattn.data.store import TOKENS_FILE
from priorattn.models import GPT, GPTConfig


@pytest.fixture
def corpus_dir(tmp_path):
    """Twelve small plays; the one named ``play07.txt`` is long enough for any test's windows."""
    root = tmp_path / "plays"
    root.mkdir()
    for i in range(12):
        (root / f"play{i:02d}.txt").write_text(f"Act {i}. " + "To be or not to be. " * (5 + 20 * i))
    return root


def test_default_corpus_end_to_end_into_a_model(tmp_path):
    data = prepare_data(None, seq_len=256, run_dir=tmp_path / "run", cache_dir=tmp_path / "cache")
    train_docs, val_docs = split_documents(load_corpus())
    train_bytes = sum(len(doc.read().encode()) for doc in train_docs)
    val_bytes = sum(len(doc.read().encode()) for doc in val_docs)
    assert (data.train_docs, data.val_docs) == (38, 4)
    assert (len(data.train.store), len(data.val.store)) == (train_bytes, val_bytes)
    assert len(data.train) == (train_bytes - 1) // 256
    assert data.unigram_loss == unigram_cross_entropy(data.train.store, data.val.store, 256)
    assert 2.5 < data.unigram_loss < 4  # bytes of English: well below uniform's log(256) = 5.5
    record = json.loads((tmp_path / "run" / "data.json").read_text())
    assert record["val_documents"] == SHAKESPEARE_VAL
    assert record["tokenizer"] == {"kind": "byte", "vocab_size": 256}
    assert (record["train_tokens"], record["val_tokens"]) == (train_bytes, val_bytes)

    tokens, targets, doc_ids = Batches(data.train, 2, seed=0).batch(0)
    config = GPTConfig(vocab_size=data.tokenizer.vocab_size, seq_len=256, d_model=32, n_layers=1, n_heads=2)
    _, loss, _ = GPT(config)(tokens, doc_ids=doc_ids, targets=targets)
    assert loss.item() == pytest.approx(
        torch.log(torch.tensor(256.0)).item(), abs=0.5
    )  # near uniform at init


def test_bpe_learns_from_the_train_split_only(corpus_dir, tmp_path):
    train_docs, val_docs = split_documents(load_corpus(str(corpus_dir)))
    val_file = corpus_dir / val_docs[0].name
    val_file.write_text(val_file.read_text() + " zyxwvut" * 200)
    kwargs = dict(tokenizer="bpe", vocab_size=400, seq_len=16, run_dir=tmp_path / "run", cache_dir=tmp_path)
    data = prepare_data(str(corpus_dir), **kwargs)
    assert len(data.tokenizer.encode(" zyxwvut")) > 1  # never merged: only validation has it
    assert len(data.tokenizer.encode(" not to be")) == 3
    assert (tmp_path / "run" / "tokenizer.json").is_file()
    resumed = prepare_data(str(corpus_dir), **kwargs, resume=True)
    assert resumed.tokenizer.to_dict() == data.tokenizer.to_dict()


def test_resume_reuses_the_cached_stores(corpus_dir, tmp_path):
    kwargs = dict(seq_len=16, run_dir=tmp_path / "run", cache_dir=tmp_path / "cache")
    data = prepare_data(str(corpus_dir), **kwargs)
    built_at = (data.train.store.path / TOKENS_FILE).stat().st_mtime_ns
    resumed = prepare_data(str(corpus_dir), **kwargs, resume=True)
    assert resumed.train.store.path == data.train.store.path
    assert (resumed.train.store.path / TOKENS_FILE).stat().st_mtime_ns == built_at
    assert resumed.unigram_loss == data.unigram_loss


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(val_fraction=0.3), "(train|val)_documents now has"),
        (dict(tokenizer="gpt2"), "tokenizer_request is now"),
        (dict(seq_len=8), "seq_len is now 8, was 16"),
    ],
)
def test_resume_on_other_data_is_refused(corpus_dir, tmp_path, change, message):
    kwargs = dict(seq_len=16, run_dir=tmp_path / "run", cache_dir=tmp_path / "cache")
    prepare_data(str(corpus_dir), **kwargs)
    with pytest.raises(ValueError, match=f"cannot resume on different data: {message}"):
        prepare_data(str(corpus_dir), **{**kwargs, **change}, resume=True)


def test_resume_after_a_document_changed_is_refused(corpus_dir, tmp_path):
    kwargs = dict(seq_len=16, run_dir=tmp_path / "run", cache_dir=tmp_path / "cache")
    prepare_data(str(corpus_dir), **kwargs)
    (corpus_dir / "play03.txt").write_text("Rewritten.")
    with pytest.raises(ValueError, match="a document's text changed"):
        prepare_data(str(corpus_dir), **kwargs, resume=True)


def test_resume_without_a_record_is_file_not_found(corpus_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="data.json is missing"):
        prepare_data(str(corpus_dir), seq_len=16, run_dir=tmp_path, cache_dir=tmp_path, resume=True)


def test_a_validation_split_shorter_than_a_window_names_the_split(corpus_dir, tmp_path):
    _, val_docs = split_documents(load_corpus(str(corpus_dir)))
    val_bytes = sum(len(doc.read().encode()) for doc in val_docs)
    with pytest.raises(ValueError, match="validation split: .* use a shorter --seq-len"):
        prepare_data(str(corpus_dir), seq_len=val_bytes, run_dir=tmp_path / "run", cache_dir=tmp_path)


def test_a_single_latin1_file_is_a_corpus_and_its_run_finds_its_parts_again(tmp_path):
    from priorattn.data import run_documents

    book = tmp_path / "livre.txt"
    book.write_bytes(
        "\n\n".join(f"Chapitre {i}. Un café, deux cafés." * 3 for i in range(40)).encode("latin-1")
    )
    run = tmp_path / "run"
    prepare_data(str(book), seq_len=16, text_encoding="latin-1", run_dir=run, cache_dir=tmp_path / "cache")
    record = json.loads((run / "data.json").read_text())
    assert record["text_encoding"] == "latin-1"
    assert len(record["train_documents"]) + len(record["val_documents"]) >= 10
    val = run_documents(run, "val")
    assert [doc.name for doc in val] == record["val_documents"]
    assert all(doc.name.startswith("livre.txt#") and "café" in doc.read() for doc in val)


def test_a_run_split_before_few_files_were_cut_finds_its_whole_documents(corpus_dir, tmp_path):
    """A data.json written when a few files were split whole names whole documents."""
    from priorattn.data import run_documents

    run = tmp_path / "run"
    prepare_data(str(corpus_dir), seq_len=16, run_dir=run, cache_dir=tmp_path / "cache")
    record = json.loads((run / "data.json").read_text())
    whole = sorted(doc.name for doc in load_corpus(str(corpus_dir)))
    record["train_documents"], record["val_documents"] = whole[1:], whole[:1]
    (run / "data.json").write_text(json.dumps(record))
    assert [doc.name for doc in run_documents(run, "val")] == whole[:1]
