"""Corpus statistics: the unigram baseline that a language model's validation loss must beat."""

from __future__ import annotations

import numpy as np

from .store import TokenStore

CHUNK = 1 << 24  # tokens counted at a time, so a memory-mapped store is never loaded whole


def token_counts(store: TokenStore, vocab_size: int) -> np.ndarray:
    """How often each token id occurs in ``store``: int64 ``(vocab_size,)``."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for start in range(0, len(store), CHUNK):
        chunk_counts = np.bincount(store.tokens[start : start + CHUNK], minlength=vocab_size)
        if len(chunk_counts) > vocab_size:
            raise ValueError(
                f"the store at {store.path} has token id {len(chunk_counts) - 1} >= vocab_size={vocab_size}"
            )
        counts += chunk_counts
    return counts


def unigram_cross_entropy(train: TokenStore, val: TokenStore, vocab_size: int) -> float:
    """Nats per token of ``val`` under the unigram distribution of ``train``, add-one smoothed:
    ``p(t) = (count_train(t) + 1) / (n_train + vocab_size)``."""
    train_counts = token_counts(train, vocab_size)  # (V,)
    val_counts = token_counts(val, vocab_size)  # (V,)
    log_p = np.log(train_counts + 1) - np.log(train_counts.sum() + vocab_size)  # (V,)
    return float(-(val_counts * log_p).sum() / val_counts.sum())
