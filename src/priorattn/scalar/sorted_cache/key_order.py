"""The key order of the sorted cache: each key head's sorted array of ``(scalar key, row)`` with its
unsorted append buffer, the arrays of every key head packed as rows of one tensor, and the merge of
new entries into a sorted array (in place, run by run, or through boolean masks).

Entries are ordered by (key, position), so the order does not depend on the order of arrival.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

#: A merge moves the old entries in place, run by run (one copy per new entry), when they outnumber
#: the new ones this many times (a buffer into a long array), and through boolean masks otherwise.
SEGMENTS_PER_ENTRY = 256


class KeyOrder:
    """One key head's entries: a sorted array of (scalar key, row) plus an unsorted append buffer.

    The arrays are views into rows of the cache's packed ``(Hk, width)`` tensors, so that a decoding
    step reads every key head with one operation."""

    def __init__(self, buf_keys: Tensor, buf_rows: Tensor):
        self.keys = buf_keys[:0]  # (n,) sorted by (key, position)
        self.rows = buf_rows[:0]  # (n,) rows of the group's table
        self.buf_keys, self.buf_rows = buf_keys, buf_rows  # (buffer_size,)
        self.buf_len = 0

    def __len__(self) -> int:
        return self.keys.shape[0] + self.buf_len


class PackedKeys:
    """Every key head's sorted array as one row of ``(Hk, width)`` tensors, padded with +inf keys
    (which keeps every row sorted): ``keys``, ``rows``, ``sizes`` (entries per key head), and what a
    decoding step derives from the sizes (computed here once, not at every step)."""

    def __init__(self, keys: Tensor, rows: Tensor, sizes: list[int]):
        self.keys, self.rows, self.sizes = keys, rows, sizes
        # (Hk, 1, 1): the last place a step may read (a row without entries reads its +inf padding)
        self.last = (torch.tensor(sizes) - 1).clamp(min=0)[:, None, None]
        self.row_start = (torch.arange(keys.shape[0]) * keys.shape[1])[:, None, None]
        self.search_reads = sum(math.ceil(math.log2(n + 1)) for n in sizes)

    @classmethod
    def pack(cls, orders: list[KeyOrder], dtype: torch.dtype) -> PackedKeys:
        """Lay the orders' sorted arrays out as rows of new packed tensors, and point each key head's
        arrays at its row."""
        width = max(1, max(order.keys.shape[0] for order in orders))
        keys = torch.full((len(orders), width), math.inf, dtype=dtype)
        rows = torch.zeros(len(orders), width, dtype=torch.int32)
        for h, order in enumerate(orders):
            n = order.keys.shape[0]
            keys[h, :n], rows[h, :n] = order.keys, order.rows
            order.keys, order.rows = keys[h, :n], rows[h, :n]
        return cls(keys, rows, [order.keys.shape[0] for order in orders])


def insertion_points(
    keys: Tensor, rows: Tensor, new_keys: Tensor, new_rows: Tensor, positions: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """The new entries sorted by (key, position), and for each, how many old entries precede it in
    that order (non-decreasing), in O(m log(n m))."""
    by_pos = torch.argsort(positions[new_rows.long()], stable=True)
    new_keys, new_rows = new_keys[by_pos], new_rows[by_pos]
    by_key = torch.argsort(new_keys, stable=True)
    new_keys, new_rows = new_keys[by_key], new_rows[by_key]
    before = torch.searchsorted(keys, new_keys, side="left")
    tied_end = torch.searchsorted(keys, new_keys, side="right")
    # Equal keys are ordered by position, so the order does not depend on arrival order. Exact ties
    # are rare in real keys; each is resolved by a search among its equals.
    for i in torch.nonzero(tied_end > before).flatten().tolist():
        lo, hi = int(before[i]), int(tied_end[i])
        tied_positions = positions[rows[lo:hi].long()]
        before[i] = lo + torch.searchsorted(tied_positions, positions[new_rows[i].long()]).item()
    return new_keys, new_rows, before


def merge_sorted(
    keys: Tensor,
    rows: Tensor,
    new_keys: Tensor,
    new_rows: Tensor,
    before: Tensor,
    out_keys: Tensor,
    out_rows: Tensor,
) -> None:
    """Merge new entries (sorted, ``before`` from ``insertion_points``) into the sorted arrays,
    writing ``out_keys`` and ``out_rows`` (length n + m) in O(n + m), for a bulk append (a prefill):
    the old entries fill the places the new ones leave, in order, with two boolean-mask copies per
    array and no per-entry Python loop."""
    is_new = np.zeros(keys.shape[0] + new_keys.shape[0], dtype=bool)
    is_new[(before + torch.arange(new_keys.shape[0])).numpy()] = True
    is_old = ~is_new
    for old, new, out in ((keys, new_keys, out_keys), (rows, new_rows, out_rows)):
        out = raw(out)
        out[is_new] = raw(new)
        out[is_old] = raw(old)


def insert_in_place(
    keys: Tensor, rows: Tensor, n: int, new_keys: Tensor, new_rows: Tensor, before: Tensor
) -> None:
    """Insert new entries (sorted, ``before`` from ``insertion_points``) into sorted arrays that
    hold ``n`` entries and have room for the new ones, in place, for a buffer into a long array:
    the old entries between two insertion points move as one contiguous copy, right by the number
    of new entries before them, the last run first. m + 1 copies at memory speed, no mask and no
    new array, so faster than ``merge_sorted`` on long arrays (measured in docs/scalar_decoding.md)."""
    m = new_keys.shape[0]
    places = (before + torch.arange(m)).numpy()  # each new entry's place among old and new
    starts = before.tolist()
    for array, new in ((keys, new_keys), (rows, new_rows)):
        target, end = raw(array), n
        for j in range(m - 1, -1, -1):
            # NumPy copies overlapping slices as if through a buffer (memmove).
            target[starts[j] + j + 1 : end + j + 1] = target[starts[j] : end]
            end = starts[j]
        target[places] = raw(new)


def raw(t: Tensor) -> np.ndarray:
    """A NumPy view of a 1-D tensor's bits (any dtype, bfloat16 included: the merge only moves them)."""
    return t.view(SAME_WIDTH_INT[t.element_size()]).numpy()


SAME_WIDTH_INT = {2: torch.int16, 4: torch.int32, 8: torch.int64}
