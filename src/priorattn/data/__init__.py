"""Real text for language-model training, offline: corpora, tokenizers, token stores, packed batches."""

from .corpus import Document, load_corpus, split_documents
from .packing import Batches, PackedSequences, eval_batches
from .stats import unigram_cross_entropy
from .store import TokenStore, cached_store, default_cache_dir
from .tokenizer import KINDS, BPETokenizer, ByteTokenizer, Tokenizer, build_tokenizer, load_tokenizer

__all__ = [
    "BPETokenizer",
    "Batches",
    "ByteTokenizer",
    "Document",
    "KINDS",
    "PackedSequences",
    "TokenStore",
    "Tokenizer",
    "build_tokenizer",
    "cached_store",
    "default_cache_dir",
    "eval_batches",
    "load_corpus",
    "load_tokenizer",
    "split_documents",
    "unigram_cross_entropy",
]
