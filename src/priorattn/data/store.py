"""Tokenized corpora on disk: one memory-mapped token array and the offset where each document starts.

A store is a directory of three files:

- ``tokens.bin``: every document's tokens, concatenated (uint16, or uint32 past 65536 tokens);
- ``doc_starts.npy``: int64 offsets ``(n_docs + 1,)``; document ``d`` is
  ``tokens[doc_starts[d]:doc_starts[d + 1]]``;
- ``meta.json``: dtype, counts, the tokenizer spec and the document names.

:func:`cached_store` keeps one store per (tokenizer, documents) under a cache directory, so a corpus
is tokenized once and then only memory-mapped.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from .corpus import Document
from .tokenizer import Tokenizer

TOKENS_FILE = "tokens.bin"
STARTS_FILE = "doc_starts.npy"
META_FILE = "meta.json"
FORMAT = "priorattn-tokens-1"  # part of every cache key: bump it when the layout above changes


class TokenStore:
    """A tokenized corpus, memory-mapped: ``len(store)`` tokens in ``store.tokens``.

    Make one with :meth:`build` or :meth:`open`. ``tokens``: read-only ``np.memmap`` ``(n_tokens,)``;
    ``doc_starts``: int64 ``(n_docs + 1,)``; ``meta``: the parsed ``meta.json``.
    """

    def __init__(self, path: Path, tokens: np.memmap, doc_starts: np.ndarray, meta: dict):
        self.path = path
        self.tokens = tokens
        self.doc_starts = doc_starts
        self.meta = meta

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def n_docs(self) -> int:
        return len(self.doc_starts) - 1

    @classmethod
    def build(cls, documents: Sequence[Document], tokenizer: Tokenizer, path: Path) -> TokenStore:
        """Tokenize ``documents`` one at a time into a new store at ``path``, then open it.

        Memory holds one document's tokens and the offsets, whatever the corpus size. The store is
        written into a temporary directory beside ``path`` and renamed into place, so ``path`` is
        either absent or complete, even if this is interrupted.
        """
        path = Path(path)
        if path.exists():
            raise FileExistsError(f"{path} exists: a token store is built into a new directory")
        path.parent.mkdir(parents=True, exist_ok=True)
        dtype = np.dtype(np.uint16 if tokenizer.vocab_size <= 2**16 else np.uint32)
        building = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
        try:
            doc_starts = [0]
            with open(building / TOKENS_FILE, "wb") as out:
                progress = tqdm(
                    documents, desc=f"tokenizing {len(documents)} documents", unit="doc", disable=None
                )
                for doc in progress:
                    ids = np.asarray(tokenizer.encode(doc.read()), dtype=dtype)
                    ids.tofile(out)
                    doc_starts.append(doc_starts[-1] + len(ids))
            if doc_starts[-1] == 0:
                raise ValueError(f"the {len(documents)} documents have no tokens: nothing to store")
            np.save(building / STARTS_FILE, np.array(doc_starts, dtype=np.int64))
            meta = {
                "format": FORMAT,
                "dtype": dtype.name,
                "n_tokens": doc_starts[-1],
                "n_docs": len(documents),
                "tokenizer": tokenizer.to_dict(),
                "documents": [doc.name for doc in documents],
            }
            (building / META_FILE).write_text(json.dumps(meta, indent=1), encoding="utf-8")
            try:
                os.replace(building, path)
            except OSError as error:
                if not path.is_dir():
                    raise
                # Another process built it meanwhile: a directory only replaces an empty one.
                raise FileExistsError(f"{path} was created while this store was being built") from error
        except BaseException:
            shutil.rmtree(building, ignore_errors=True)
            raise
        return cls.open(path)

    @classmethod
    def open(cls, path: Path) -> TokenStore:
        """Memory-map the store at ``path`` (read-only), after checking its files agree."""
        path = Path(path)
        if not (path / META_FILE).is_file():
            raise FileNotFoundError(f"no token store at {path}: {META_FILE} is missing")
        try:
            meta = json.loads((path / META_FILE).read_text(encoding="utf-8"))
            dtype, n_tokens, n_docs = np.dtype(meta["dtype"]), meta["n_tokens"], meta["n_docs"]
            doc_starts = np.load(path / STARTS_FILE)
            size = (path / TOKENS_FILE).stat().st_size
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise corrupt(path, f"{type(error).__name__}: {error}") from error
        if size != n_tokens * dtype.itemsize:
            expected = f"{n_tokens} {dtype.name} tokens = {n_tokens * dtype.itemsize} bytes"
            raise corrupt(path, f"{TOKENS_FILE} has {size} bytes but {META_FILE} says {expected}")
        if doc_starts.shape != (n_docs + 1,) or doc_starts[0] != 0 or doc_starts[-1] != n_tokens:
            raise corrupt(path, f"{STARTS_FILE} does not hold {n_docs + 1} offsets from 0 to {n_tokens}")
        if np.any(np.diff(doc_starts) < 0):
            raise corrupt(path, f"{STARTS_FILE} offsets decrease")
        tokens = np.memmap(path / TOKENS_FILE, dtype=dtype, mode="r", shape=(n_tokens,))
        return cls(path, tokens, doc_starts, meta)


def corrupt(path: Path, reason: str) -> ValueError:
    return ValueError(f"corrupt token store at {path} ({reason}): delete the directory to rebuild it")


def default_cache_dir() -> Path:
    """``$PRIORATTN_CACHE/tokens``, by default ``~/.cache/priorattn/tokens``."""
    root = os.environ.get("PRIORATTN_CACHE", "~/.cache/priorattn")
    return Path(root).expanduser() / "tokens"


def store_key(documents: Sequence[Document], tokenizer: Tokenizer) -> str:
    """A name for the store of ``documents`` under ``tokenizer``: it changes with any document's name
    or content, their order, or the tokenizer (a trained BPE's spec holds its tokenizer.json hash)."""
    key = hashlib.sha256(json.dumps([FORMAT, tokenizer.to_dict()], sort_keys=True).encode())
    for doc in documents:
        content = hashlib.sha256(doc.read().encode("utf-8")).hexdigest()
        key.update(json.dumps([doc.name, content]).encode())
    return key.hexdigest()[:32]


def cached_store(
    documents: Sequence[Document], tokenizer: Tokenizer, cache_dir: Path | None = None
) -> TokenStore:
    """The store of ``documents`` under ``tokenizer`` in ``cache_dir/<store_key>``, built if missing.

    ``cache_dir`` defaults to :func:`default_cache_dir`. Each document is read once to hash it.
    """
    path = Path(cache_dir or default_cache_dir()) / store_key(documents, tokenizer)
    if not path.exists():
        try:
            return TokenStore.build(documents, tokenizer, path)
        except FileExistsError:
            pass  # another process (say, another rank) built the same store meanwhile
    return TokenStore.open(path)
