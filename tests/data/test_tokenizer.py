"""Tokenizers: round trips, GPT-2's ids, a BPE trained offline, and specs that load back."""

from __future__ import annotations

import json

import pytest

from priorattn.data import BPETokenizer, ByteTokenizer, build_tokenizer, load_tokenizer

TEXT = "Où est la plume de ma tante? — Größe, 東京, emoji 🎭.\nNew line\ttab"


@pytest.fixture
def corpus(documents):
    verse = "Shall I compare thee to a summer's day? Thou art more lovely and more temperate. "
    prose = "Rough winds do shake the darling buds of May, and summer's lease hath all too short a date. "
    return documents(sonnet=verse * 40, prose=prose * 40, accents="café naïve résumé " * 30)


def test_byte_tokenizer_round_trips_non_ascii():
    tokenizer = ByteTokenizer()
    ids = tokenizer.encode(TEXT)
    assert ids == list(TEXT.encode("utf-8"))
    assert max(ids) < tokenizer.vocab_size == 256
    assert tokenizer.decode(ids) == TEXT


def test_byte_tokenizer_decodes_a_cut_character_as_replacement():
    assert ByteTokenizer().decode(list("é".encode())[:1]) == "\ufffd"


def test_gpt2_ids_match_openai():
    tokenizer = BPETokenizer.gpt2()
    assert tokenizer.vocab_size == 50257
    assert tokenizer.encode("Hello world") == [15496, 995]
    assert tokenizer.decode(tokenizer.encode(TEXT)) == TEXT


def test_trained_bpe_round_trips_and_merges(corpus):
    tokenizer = BPETokenizer.train(corpus, 300)
    assert 256 < tokenizer.vocab_size <= 300
    ids = tokenizer.encode("Shall I compare thee to a summer's day?")
    assert len(ids) < len("Shall I compare thee to a summer's day?")  # merges learned
    assert tokenizer.decode(tokenizer.encode(TEXT)) == TEXT  # unseen characters still encode


def test_trained_bpe_saves_and_loads_with_identical_ids(corpus, tmp_path):
    tokenizer = build_tokenizer("bpe", corpus, 300)
    tokenizer.save(tmp_path)
    spec = json.loads(json.dumps(tokenizer.to_dict()))  # as it comes back from config.json
    loaded = load_tokenizer(spec, tmp_path)
    assert loaded.to_dict() == spec
    assert loaded.encode(TEXT) == tokenizer.encode(TEXT)


def test_trained_bpe_without_its_file_is_a_clear_error(corpus, tmp_path):
    spec = build_tokenizer("bpe", corpus, 300).to_dict()
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_tokenizer(spec, tmp_path)


def test_trained_bpe_from_another_run_is_refused(corpus, tmp_path):
    spec = build_tokenizer("bpe", corpus, 300).to_dict()
    build_tokenizer("bpe", corpus[:1], 280).save(tmp_path)
    with pytest.raises(ValueError, match="not the saved spec"):
        load_tokenizer(spec, tmp_path)


@pytest.mark.parametrize("kind", ["byte", "gpt2"])
def test_fixed_tokenizers_load_from_their_spec(kind, tmp_path):
    tokenizer = build_tokenizer(kind, [])
    tokenizer.save(tmp_path)
    assert load_tokenizer(tokenizer.to_dict(), tmp_path).encode(TEXT) == tokenizer.encode(TEXT)


def test_fixed_vocabulary_refuses_another_size():
    with pytest.raises(ValueError, match="fixed vocabulary of 256"):
        build_tokenizer("byte", [], vocab_size=1000)


def test_bpe_vocabulary_below_the_bytes_is_refused(corpus):
    with pytest.raises(ValueError, match="vocab_size.*>= 256"):
        build_tokenizer("bpe", corpus, 100)


def test_unknown_kind_lists_the_kinds(tmp_path):
    with pytest.raises(ValueError, match=r"\('byte', 'bpe', 'gpt2'\).*'chars'"):
        build_tokenizer("chars", [])
    with pytest.raises(ValueError, match="'chars'"):
        load_tokenizer({"kind": "chars"}, tmp_path)
