"""Real text for language-model training, offline: corpora, tokenizers and token stores on disk."""

from .corpus import Document, load_corpus, split_documents
from .store import TokenStore, cached_store, default_cache_dir
from .tokenizer import KINDS, BPETokenizer, ByteTokenizer, Tokenizer, build_tokenizer, load_tokenizer

__all__ = [
    "BPETokenizer",
    "ByteTokenizer",
    "Document",
    "KINDS",
    "TokenStore",
    "Tokenizer",
    "build_tokenizer",
    "cached_store",
    "default_cache_dir",
    "load_corpus",
    "load_tokenizer",
    "split_documents",
]
