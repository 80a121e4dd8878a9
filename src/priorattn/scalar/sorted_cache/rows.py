"""The row store of the sorted cache: every value group's rows (values, vector keys, positions,
log-counts) in arrival order, in one table per field that all groups share.

A key head's sorted array (:mod:`.key_order`) points into these rows by index, so that keeping the
order sorted moves 8 bytes per entry instead of a whole value row, and grouped values need no copy
per head.
"""

from __future__ import annotations

import torch
from torch import Tensor

#: Row tables and sorted arrays grow by this factor when full: amortized O(1) copies per insert
#: with at most 25% slack.
GROWTH = 1.25


class RowTables:
    """Every value group's rows in arrival order: values, vector keys (hybrid), positions, and the
    log-counts of merged entries (allocated at the first density merge: until then every count is 1).

    The groups' tables are the slices ``[g]`` of one ``(G, capacity, ...)`` tensor per field, so that
    a decoding step gathers the rows of every group with one ``index_select`` (and a token is
    appended to every group with one write); each group fills its own ``rows[g]`` rows."""

    def __init__(
        self, groups: int, value_dim: int, vector_key_dim: int | None, dtype: torch.dtype, capacity: int
    ):
        self.rows = [0] * groups
        self.values = torch.empty(groups, capacity, value_dim, dtype=dtype)
        self.vec_keys = (
            None if vector_key_dim is None else torch.empty(groups, capacity, vector_key_dim, dtype=dtype)
        )
        self.positions = torch.empty(groups, capacity, dtype=torch.int32)
        self.log_count: Tensor | None = None
        self.max_log_count = [0.0] * groups  # bounds the count of any entry a step does not read
        # Largest vector-key norm ever stored: bounds <q, k> of every entry outside a window. Means of
        # stored keys (merged entries) never exceed it, and eviction only removes keys.
        self.max_vec_norm = [0.0] * groups

    _FIELDS = ("values", "vec_keys", "positions", "log_count")

    def tensors(self) -> list[Tensor]:
        return [t for t in (getattr(self, name) for name in self._FIELDS) if t is not None]

    @property
    def capacity(self) -> int:
        return self.values.shape[1]

    def flat(self, rows: Tensor) -> Tensor:
        """Indices into the ``(G capacity, ...)`` view of the fields of the rows ``(G, r)`` of each group."""
        return rows + torch.arange(0, len(self.rows) * self.capacity, self.capacity)[:, None]

    def counts_of(self, group: int, rows: Tensor) -> Tensor:
        """Log-counts of the given rows of a group (0 for a token that stands for itself)."""
        if self.log_count is None:
            return torch.zeros(rows.shape, dtype=self.values.dtype)
        return take(self.log_count[group], rows)

    def _resize(self, capacity: int) -> None:
        for name in self._FIELDS:
            old = getattr(self, name)
            if old is not None:
                new = old.new_empty((old.shape[0], capacity, *old.shape[2:]))
                kept = min(capacity, old.shape[1])
                new[:, :kept] = old[:, :kept]
                setattr(self, name, new)

    def reserve(self, rows: int) -> None:
        if rows > self.capacity:
            self._resize(max(rows, int(self.capacity * GROWTH) + 1))

    def add_tokens(self, values: Tensor, vec_keys: Tensor | None, positions: Tensor) -> list[int]:
        """Append tokens to every group (``values (L, G, Dv)``, ``vec_keys (L, G, Dk)``); returns the
        first new row of each group."""
        first = list(self.rows)
        if len(set(first)) > 1:  # the groups' tables differ in length (merging or compaction)
            return [
                self.add(g, values[:, g], None if vec_keys is None else vec_keys[:, g], positions)
                for g in range(len(first))
            ]
        L, start = values.shape[0], first[0]
        self.reserve(start + L)
        rows = slice(start, start + L)
        self.values[:, rows] = values.transpose(0, 1)
        self.positions[:, rows] = positions
        if vec_keys is not None:
            self.vec_keys[:, rows] = vec_keys.transpose(0, 1)
            if L:
                norms = vec_keys.norm(dim=-1).amax(dim=0).tolist()
                self.max_vec_norm = [max(old, new) for old, new in zip(self.max_vec_norm, norms)]
        if self.log_count is not None:
            self.log_count[:, rows] = 0.0
        self.rows = [start + L] * len(first)
        return first

    def add(
        self,
        group: int,
        values: Tensor,
        vec_keys: Tensor | None,
        positions: Tensor,
        log_count: Tensor | None = None,
    ) -> int:
        """Append rows to one group; returns the index of the first."""
        L, start = values.shape[0], self.rows[group]
        self.reserve(start + L)
        rows = slice(start, start + L)
        self.values[group, rows] = values
        if vec_keys is not None:
            self.vec_keys[group, rows] = vec_keys
            if L:
                self.max_vec_norm[group] = max(self.max_vec_norm[group], vec_keys.norm(dim=-1).max().item())
        self.positions[group, rows] = positions
        if log_count is not None and self.log_count is None:
            self.log_count = self.values.new_zeros(self.values.shape[:2])
        if self.log_count is not None:
            self.log_count[group, rows] = 0.0 if log_count is None else log_count
        if log_count is not None and L:
            self.max_log_count[group] = max(self.max_log_count[group], log_count.max().item())
        self.rows[group] += L
        return start

    def keep(self, group: int, live: Tensor) -> Tensor:
        """Drop a group's rows where ``live`` (bool, ``(rows,)``) is False; returns old row -> new row."""
        kept = int(live.sum())
        for name in self._FIELDS:
            field = getattr(self, name)
            if field is not None:
                field[group, :kept] = field[group, : self.rows[group]][live]
        self.rows[group] = kept
        return (torch.cumsum(live, 0) - 1).to(torch.int32)

    def permute(self, group: int, first: Tensor) -> Tensor:
        """Reorder a group's rows: ``first`` (distinct rows) in that order, then the others as they
        were; returns old row -> new row."""
        rows = self.rows[group]
        rest = torch.ones(rows, dtype=torch.bool)
        rest[first.long()] = False
        order = torch.cat([first.long(), torch.nonzero(rest).flatten()])
        for name in self._FIELDS:
            field = getattr(self, name)
            if field is not None:
                field[group, :rows] = field[group].index_select(0, order)
        new_row = torch.empty(rows, dtype=torch.int32)
        new_row[order] = torch.arange(rows, dtype=torch.int32)
        return new_row

    def fit(self) -> None:
        """Release the capacity beyond the longest group's rows (after compaction)."""
        if max(self.rows) < self.capacity:
            self._resize(max(1, max(self.rows)))


def take(source: Tensor, index: Tensor) -> Tensor:
    """``source[index]`` for an index of any shape, through ``index_select`` (several times faster
    than advanced indexing on CPU for the scattered reads of a window)."""
    return source.index_select(0, index.reshape(-1)).view(*index.shape, *source.shape[1:])
