"""Real text for language-model training, offline: corpora and their document-level split."""

from .corpus import Document, load_corpus, split_documents

__all__ = ["Document", "load_corpus", "split_documents"]
