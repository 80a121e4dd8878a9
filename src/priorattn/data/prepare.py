"""From a corpus source to packed train/validation windows in one call, recorded in the run directory.

:func:`prepare_data` loads and splits the corpus, builds the tokenizer on the train split (or, when
resuming, reloads the run's), tokenizes both splits into cached stores and packs them. What it used
is written to ``run_dir/data.json``; a resumed run is checked against it, so it continues on the same
data.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..files import read_json, write_json_atomic
from .corpus import Document, cut_few_documents, load_corpus, split_documents
from .packing import PackedSequences
from .stats import unigram_cross_entropy
from .store import TokenStore, cached_store
from .tokenizer import Tokenizer, build_tokenizer, load_tokenizer

DATA_FILE = "data.json"
# What a resumed run must share with data.json (the split, the tokenizer asked for, the windows) and
# what only follows from them (the stores' keys, which also change when a document's text changes).
SAME_REQUEST = ("train_documents", "val_documents", "tokenizer_request", "seq_len")
SAME_CONTENT = ("train_store", "val_store")


@dataclass
class Data:
    """A run's data: the tokenizer, packed windows of each split, and the unigram baseline loss
    (nats/token of validation under the train split's token frequencies) that a model must beat."""

    tokenizer: Tokenizer
    train: PackedSequences
    val: PackedSequences
    unigram_loss: float
    train_docs: int
    val_docs: int


def prepare_data(
    source: str | None,
    *,
    tokenizer: str | Tokenizer = "byte",
    vocab_size: int | None = None,
    seq_len: int,
    val_fraction: float = 0.1,
    text_encoding: str = "utf-8",
    run_dir: Path,
    cache_dir: Path | None = None,
    resume: bool = False,
) -> Data:
    """Load ``source`` (see :func:`load_corpus`), split it by document, tokenize and pack it.

    - ``tokenizer``, ``vocab_size``: see :func:`build_tokenizer`; a BPE learns from the train split
      only. Or a :class:`Tokenizer` ready made (a pretrained model's). It is saved in ``run_dir``.
    - ``text_encoding``: how text files are decoded (see :func:`load_corpus`).
    - ``cache_dir``: where token stores are cached (default :func:`default_cache_dir`).
    - ``resume``: reload the tokenizer saved in ``run_dir`` instead of building one, after checking
      that the split, tokenizer, ``seq_len`` and document texts match ``run_dir/data.json``.
    """
    run_dir = Path(run_dir)
    train_docs, val_docs = split_documents(load_corpus(source, text_encoding), val_fraction)
    record = {
        "source": source,
        "text_encoding": text_encoding,
        "tokenizer_request": (
            {"kind": tokenizer, "vocab_size": vocab_size}
            if isinstance(tokenizer, str)
            else tokenizer.to_dict()
        ),
        "seq_len": seq_len,
        "val_fraction": val_fraction,
        "train_documents": [doc.name for doc in train_docs],
        "val_documents": [doc.name for doc in val_docs],
    }
    if resume:
        saved = read_data_record(run_dir)
        check_same(saved, record, SAME_REQUEST, run_dir)
        text_tokenizer = load_tokenizer(saved["tokenizer"], run_dir)
    else:
        text_tokenizer = tokenizer
        if isinstance(tokenizer, str):
            text_tokenizer = build_tokenizer(tokenizer, train_docs, vocab_size)
        text_tokenizer.save(run_dir)
    train_store = cached_store(train_docs, text_tokenizer, cache_dir)
    val_store = cached_store(val_docs, text_tokenizer, cache_dir)
    record |= {"train_store": train_store.path.name, "val_store": val_store.path.name}
    if resume:
        check_same(saved, record, SAME_CONTENT, run_dir)
    train = pack(train_store, seq_len, "train")
    val = pack(val_store, seq_len, "validation")
    unigram_loss = unigram_cross_entropy(train_store, val_store, text_tokenizer.vocab_size)
    if not resume:
        record |= {
            "tokenizer": text_tokenizer.to_dict(),
            "train_tokens": len(train_store),
            "val_tokens": len(val_store),
            "unigram_loss": unigram_loss,
        }
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(run_dir / DATA_FILE, record)
    return Data(text_tokenizer, train, val, unigram_loss, len(train_docs), len(val_docs))


def read_data_record(run_dir: Path) -> dict:
    path = run_dir / DATA_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: no run has prepared its data in {run_dir}")
    return read_json(path)


def run_documents(run_dir: Path, split: str = "val") -> list[Document]:
    """The documents of a run's ``"train"`` or ``"val"`` split, as :func:`prepare_data` split them
    (read again from the run's corpus source, so the text is the run's only if the source is)."""
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    record = read_data_record(Path(run_dir))
    names = record[f"{split}_documents"]
    # data.json written before text_encoding existed: those runs read their files as UTF-8
    documents = load_corpus(record["source"], record.get("text_encoding", "utf-8"))
    # a short corpus's parts, and its whole documents for runs split before it was cut
    by_name = {doc.name: doc for doc in [*documents, *cut_few_documents(documents)]}
    missing = [name for name in names if name not in by_name]
    if missing:
        raise FileNotFoundError(
            f"the {split} documents {missing[:3]} of {run_dir} are no longer in its corpus "
            f"{record['source']!r}"
        )
    return [by_name[name] for name in names]


def check_same(saved: dict, record: dict, keys: tuple[str, ...], run_dir: Path) -> None:
    """Raise if ``record`` differs from the ``saved`` data.json at any of ``keys``, saying how."""
    for key in keys:
        if saved.get(key) == record[key]:
            continue
        if key.endswith("_documents"):
            added = sorted(set(record[key]) - set(saved.get(key, [])))
            missing = sorted(set(saved.get(key, [])) - set(record[key]))
            change = f"now has {added[:5]} and lacks {missing[:5]}"
        elif key.endswith("_store"):
            change = "a document's text changed (its tokens' cache key differs)"
        else:
            change = f"is now {record[key]!r}, was {saved.get(key)!r}"
        raise ValueError(
            f"cannot resume on different data: {key} {change} compared with {run_dir / DATA_FILE}; "
            "a run must continue on the data it started with (start a new run_dir to change it)"
        )


def pack(store: TokenStore, seq_len: int, split: str) -> PackedSequences:
    try:
        return PackedSequences(store, seq_len)
    except ValueError as error:
        raise ValueError(f"{split} split: {error}") from None
