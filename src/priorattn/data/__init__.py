"""Real text for language-model training, offline: corpora, their document-level split, tokenizers."""

from .corpus import Document, load_corpus, split_documents
from .tokenizer import KINDS, BPETokenizer, ByteTokenizer, Tokenizer, build_tokenizer, load_tokenizer

__all__ = [
    "BPETokenizer",
    "ByteTokenizer",
    "Document",
    "KINDS",
    "Tokenizer",
    "build_tokenizer",
    "load_corpus",
    "load_tokenizer",
    "split_documents",
]
