"""Real text for language-model training, offline: corpora, tokenizers, token stores, packed batches.

``prepare_data(source, seq_len=..., run_dir=...)`` does it all; the pieces are: ``load_corpus`` and
``split_documents`` (corpus.py), tokenizers (tokenizer.py), ``TokenStore`` and ``cached_store``
(store.py), ``PackedSequences``, ``Batches``, ``eval_batches`` and ``document_positions``
(packing.py), the ``unigram_cross_entropy`` baseline (stats.py), synthetic passkey/needle
sequences in text (retrieval.py), and synthetic retrieval over a small vocabulary of its own
(``SyntheticTask``: passkey, MQAR, multi-key NIAH, and the tasks that need position; synthetic.py).
``run_documents`` gives back a run's validation (or train) documents.
"""

from .corpus import Document, load_corpus, split_documents
from .packing import Batches, PackedSequences, document_positions, eval_batches
from .prepare import Data, prepare_data, read_data_record, run_documents
from .stats import unigram_cross_entropy
from .store import TokenStore, cached_store, default_cache_dir
from .synthetic import SYNTHETIC_TASKS, SyntheticSample, SyntheticTask, training_lengths
from .tokenizer import (
    KINDS,
    BPETokenizer,
    ByteTokenizer,
    Tokenizer,
    build_tokenizer,
    load_tokenizer,
    vocab_size_of,
)

__all__ = [
    "BPETokenizer",
    "Batches",
    "ByteTokenizer",
    "Data",
    "Document",
    "KINDS",
    "PackedSequences",
    "SYNTHETIC_TASKS",
    "SyntheticSample",
    "SyntheticTask",
    "TokenStore",
    "Tokenizer",
    "build_tokenizer",
    "cached_store",
    "default_cache_dir",
    "document_positions",
    "eval_batches",
    "load_corpus",
    "load_tokenizer",
    "prepare_data",
    "read_data_record",
    "run_documents",
    "split_documents",
    "training_lengths",
    "unigram_cross_entropy",
    "vocab_size_of",
]
