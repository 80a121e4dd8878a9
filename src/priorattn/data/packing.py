"""Training windows over a token store, and deterministic, resumable batches of them.

The token stream (documents back to back) is cut into windows of ``seq_len + 1`` tokens; a window's
first ``seq_len`` tokens are the inputs and its last ``seq_len`` the next-token targets. Documents are
packed (seed 003 App. C): a window may hold several, ``doc_ids`` tell the model which token belongs to
which (it masks attention between documents), no loss is taken on predicting across a boundary, and
:func:`document_positions` restarts the positions at each document, so a packed document is seen as
it would be alone.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch import Tensor

from ..checks import describe, is_integer_tensor
from .store import TokenStore

IGNORE_INDEX = -100  # targets with no loss, as F.cross_entropy's ignore_index


class PackedSequences:
    """The ``n = (len(store) - 1) // seq_len`` windows of a store; window ``i`` starts at ``i * seq_len``.

    Consecutive windows overlap by one token, so every token but the first is a target exactly once.
    """

    def __init__(self, store: TokenStore, seq_len: int):
        if not isinstance(seq_len, int) or seq_len < 1:
            raise ValueError(f"seq_len must be a positive int, got {seq_len!r}")
        n = (len(store) - 1) // seq_len
        if n == 0:
            raise ValueError(
                f"the token store at {store.path} has {len(store)} tokens, fewer than "
                f"seq_len + 1 = {seq_len + 1}: use a shorter --seq-len or more data"
            )
        self.store = store
        self.seq_len = seq_len
        self.n = n
        self.doc_starts = torch.from_numpy(store.doc_starts)  # (n_docs + 1,)

    def __len__(self) -> int:
        return self.n

    def batch(self, indices: Sequence[int] | Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Windows ``indices: (B,)`` as ``(tokens, targets, doc_ids)``, each long ``(B, seq_len)``.

        ``doc_ids``: the document of each input token. ``targets``: the next token, or -100 where it
        belongs to another document than the input token (no loss across a document boundary).
        """
        indices = torch.as_tensor(indices, device="cpu")  # windows are read from the memmap on the CPU
        if not is_integer_tensor(indices) or indices.dim() != 1:
            raise ValueError(f"indices must be integers (B,), got {describe(indices)}")
        if len(indices) and not (0 <= indices.min() and indices.max() < self.n):
            low, high = indices.min().item(), indices.max().item()
            raise ValueError(f"indices must be in [0, {self.n}), got values from {low} to {high}")
        offsets = torch.arange(self.seq_len + 1)  # (seq_len + 1,)
        positions = indices.long()[:, None] * self.seq_len + offsets  # (B, seq_len + 1)
        window = torch.from_numpy(self.store.tokens[positions.numpy()].astype(np.int64))  # (B, seq_len + 1)
        docs = torch.searchsorted(self.doc_starts, positions, right=True) - 1  # (B, seq_len + 1)
        crosses = docs[:, 1:] != docs[:, :-1]  # (B, seq_len): target in the next document
        targets = window[:, 1:].masked_fill(crosses, IGNORE_INDEX)
        return window[:, :-1], targets, docs[:, :-1]


def document_positions(doc_ids: Tensor) -> Tensor:
    """Positions that restart at 0 on every document boundary of packed rows ``doc_ids: (B, L)``.

    A document that began before the window counts from the window's first token, so every position
    stays below ``L`` as in evaluation (where a window is one document from position 0). When no row
    crosses a boundary the result is the shared ``arange(L)``, ``(L,)``, which keeps attention on its
    fast paths for positions shared by the batch; otherwise ``(B, L)``. Both long, on ``doc_ids``'s device.
    """
    if not is_integer_tensor(doc_ids) or doc_ids.dim() != 2:
        raise ValueError(f"doc_ids must be an integer tensor (B, L), got {describe(doc_ids)}")
    index = torch.arange(doc_ids.shape[1], device=doc_ids.device)  # (L,)
    starts = torch.ones_like(doc_ids, dtype=torch.bool)
    starts[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]  # (B, L): a document begins here
    if not starts[:, 1:].any():
        return index
    first = torch.where(starts, index, 0).cummax(dim=1).values  # (B, L): where each token's document began
    return index - first


class Batches:
    """Batch ``step`` of an endless shuffled stream of windows, computed from ``(seed, step)`` alone.

    The stream is epoch after epoch, each a permutation of all windows seeded by ``(seed, epoch)``;
    batch ``step`` is stream positions ``[step * batch_size, (step + 1) * batch_size)``, so it may
    straddle two epochs (or span several when ``batch_size > n``). Resuming at a step needs no state.
    """

    def __init__(self, packed: PackedSequences, batch_size: int, seed: int):
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        self.packed = packed
        self.batch_size = batch_size
        self.seed = seed
        # A step needs one or two epochs' permutations: remembering them saves a randperm(n) per step.
        self._permutation = functools.lru_cache(maxsize=2)(self.epoch_permutation)

    def epoch_permutation(self, epoch: int) -> Tensor:
        """The order of all windows in ``epoch``: ``(n,)``, seeded by a hash of ``(seed, epoch)``."""
        digest = hashlib.sha256(f"{self.seed}:{epoch}".encode()).digest()
        generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
        return torch.randperm(len(self.packed), generator=generator)

    def global_indices(self, step: int) -> Tensor:
        """The window indices of batch ``step`` across all ranks: long ``(batch_size,)``."""
        if not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be a non-negative int, got {step!r}")
        n = len(self.packed)
        stream = step * self.batch_size + torch.arange(self.batch_size)  # (batch_size,)
        epochs = stream // n
        indices = torch.empty(self.batch_size, dtype=torch.long)
        for epoch in epochs.unique().tolist():
            in_epoch = epochs == epoch
            indices[in_epoch] = self._permutation(epoch)[stream[in_epoch] % n]
        return indices

    def batch(self, step: int, rank: int = 0, world_size: int = 1) -> tuple[Tensor, Tensor, Tensor]:
        """Rank ``rank``'s share ``global_indices(step)[rank::world_size]``, packed as in
        :meth:`PackedSequences.batch`: each long ``(batch_size // world_size, seq_len)``."""
        if not isinstance(world_size, int) or world_size < 1 or self.batch_size % world_size:
            raise ValueError(
                f"world_size must be a positive int dividing batch_size={self.batch_size}, got {world_size!r}"
            )
        if not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ValueError(f"rank must be an int in [0, {world_size}), got {rank!r}")
        return self.packed.batch(self.global_indices(step)[rank::world_size])


def eval_batches(
    packed: PackedSequences, batch_size: int, max_sequences: int | None = None
) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
    """The first ``min(n, max_sequences)`` windows in order, ``batch_size`` at a time (the last may be
    smaller), each as :meth:`PackedSequences.batch` returns them."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if max_sequences is not None and (not isinstance(max_sequences, int) or max_sequences < 1):
        raise ValueError(f"max_sequences must be a positive int or None, got {max_sequences!r}")
    total = len(packed) if max_sequences is None else min(len(packed), max_sequences)
    starts = range(0, total, batch_size)
    return (packed.batch(torch.arange(start, min(start + batch_size, total))) for start in starts)
