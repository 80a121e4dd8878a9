"""Sorted-cache decoding for scalar (and hybrid) attention (seed 002, "Binary Search at Inference").

A decoding step of scalar attention scores query head ``h`` against cached entry ``j`` as

    s_hj = -(q_s,h - k_s,j)^2 / tau_h  [+ scale * <q_h, k_j>]  + log c_j        (seed 002)

where the bracket is the hybrid score and ``c_j`` is how many tokens entry ``j`` stands for (1, or
more after density merging: a merged entry keeps its members' weight in the softmax). The scalar
term is unimodal in ``k_s``, so the entries nearest ``q_s`` are contiguous in key order: the cache
keeps every key head's entries sorted by scalar key, a step binary-searches the query and attends
exactly over the ``window`` nearest entries, and reports a rigorous upper bound on the attention
mass it left out.

Layout (why not the seed's sorted array of values): values, and the vector keys of hybrid
attention, stay in one append-only row table per value group, in arrival order (the G tables are
slices of one tensor, so a step gathers every group's window with one read); each key head keeps a
sorted array of ``(scalar key, row)``. Grouped values (seed 002 "Grouped Value Attention")
then need no copy of a value per head, and keeping the order sorted moves 8 bytes per entry instead
of a whole value row. New entries go to a small unsorted append buffer whose entries all join
every window; when it holds ``buffer_size`` entries it is sorted and merged into the sorted array
in one O(n) pass, in place (the old entries move run by run into the array's padding). A step
costs O(log n + window + buffer_size) scalar reads and ``window + buffer_size`` row reads at most;
an insert costs O(1) plus an amortized O(n / buffer_size) share of the merges (the seed's
O(log n) insertion needs a tree; in a flat tensor each insertion would shift O(n) entries).
Measured costs: docs/scalar_decoding.md.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "DecodeStep",
    "DensityMerge",
    "GeometricEviction",
    "SortedScalarCache",
    "scalar_attention_reference",
]

#: Weights below e^EXP_FLOOR of the window's largest are dropped: they are below float32 resolution,
#: and exp() of numbers under -87 gives float32 subnormals, which cost ~300x a normal exp on x86
#: (measured: 600 us against 1.7 us for 4096 values). Dropping them moves an output by at most
#: window * e^-80 ~ 1e-32 of its scale.
EXP_FLOOR = -80.0
#: Row tables and sorted arrays grow by this factor when full: amortized O(1) copies per insert
#: with at most 25% slack.
GROWTH = 1.25
#: A merge moves the old entries in place, run by run (one copy per new entry), when they outnumber
#: the new ones this many times (a buffer into a long array), and through boolean masks otherwise.
SEGMENTS_PER_ENTRY = 256


@dataclass(frozen=True)
class GeometricEviction:
    """Evict entries whose key lies outside ``[min q - margin, max q + margin]`` over the queries
    that searched the key head in the last ``recent`` decoding steps (seed 002 "Explicit Eviction
    Policies": geometric eviction). Applied whenever the append buffer is merged, and by
    ``SortedScalarCache.flush()``.
    """

    recent: int = 256
    margin: float = 3.0

    def __post_init__(self):
        if not (isinstance(self.recent, int) and self.recent >= 1):
            raise ValueError(f"GeometricEviction.recent must be an int >= 1, got {self.recent!r}")
        if not (math.isfinite(self.margin) and self.margin >= 0):
            raise ValueError(f"GeometricEviction.margin must be finite and >= 0, got {self.margin!r}")


@dataclass(frozen=True)
class DensityMerge:
    """Once a key head holds more than ``max_entries`` entries, merge the entries whose keys fall in
    the same bin ``floor(k_s / width)`` into one (seed 002 "Density-based compression": 1D histogram
    compression): count-weighted centroid key, count-weighted mean value (and vector key), summed
    count. Applied whenever the append buffer is merged, and by ``SortedScalarCache.flush()``.
    """

    width: float
    max_entries: int

    def __post_init__(self):
        if not (math.isfinite(self.width) and self.width > 0):
            raise ValueError(f"DensityMerge.width must be finite and > 0, got {self.width!r}")
        if not (isinstance(self.max_entries, int) and self.max_entries >= 1):
            raise ValueError(f"DensityMerge.max_entries must be an int >= 1, got {self.max_entries!r}")


@dataclass
class DecodeStep:
    """One decoding step: ``output (H, Dv)``; ``mass_outside_bound (H,)``, an upper bound on the
    fraction of the exact attention mass that falls outside the window (so the window captures at
    least ``1 - mass_outside_bound``); ``keys_read``, scalar keys read for all query heads (binary
    search, the slice around the insertion point, the append buffer, the bound's block edges);
    ``rows_read``, value rows read (the window's sorted entries and the whole buffer)."""

    output: Tensor
    mass_outside_bound: Tensor
    keys_read: int
    rows_read: int

    @property
    def mass_captured_bound(self) -> Tensor:
        """A lower bound on the fraction of attention mass inside the window, per head."""
        return 1.0 - self.mass_outside_bound


def scalar_attention_reference(
    q_s: Tensor,
    tau: Tensor | float,
    k_s: Tensor,
    v: Tensor,
    *,
    log_count: Tensor | None = None,
    q_vec: Tensor | None = None,
    k_vec: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """Dense attention of one query per head over every cached entry: the definition.

    ``q_s (H,)``, ``tau`` a float or ``(H,)``, ``k_s (Hk, n)``, ``v (G, n, Dv)``, optional
    ``log_count (Hk, n)``; hybrid with ``q_vec (H, Dk)`` and ``k_vec (G, n, Dk)``. Query head ``h``
    reads key head ``h // (H / Hk)`` and value group ``h // (H / G)``. Returns ``(H, Dv)``.
    """
    H, Hk, G = q_s.shape[0], k_s.shape[0], v.shape[0]
    n = k_s.shape[-1]
    tau = torch.as_tensor(tau, dtype=q_s.dtype).expand(H)
    keys = k_s.repeat_interleave(H // Hk, dim=0)  # (H, n)
    scores = -((q_s[:, None] - keys) ** 2) / tau[:, None]
    if log_count is not None:
        scores = scores + log_count.repeat_interleave(H // Hk, dim=0)
    scores = scores.view(G, H // G, n)  # the heads of a group read one value (and vector key) table
    if q_vec is not None:
        scale = q_vec.shape[-1] ** -0.5 if scale is None else scale
        scores = scores + scale * (q_vec.view(G, H // G, -1) @ k_vec.transpose(1, 2))
    weights = torch.softmax(scores, dim=-1)
    return (weights @ v).reshape(H, v.shape[-1])


class _RowTables:
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
        return _take(self.log_count[group], rows)

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


class _KeyOrder:
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


@functools.cache
def _offsets(window: int, blocks: int) -> tuple[Tensor, Tensor]:
    """The places a step reads, as offsets from the insertion point: the slice ``-window .. window -
    1``, then the inner edges of ``blocks`` blocks of doubling size on each side (reaching ``0, w, 3w,
    7w, ...`` beyond the slice's outermost entries); and ``window + j``, the slice's right half."""
    reach = window * (2 ** torch.arange(blocks) - 1)
    offsets = torch.cat([torch.arange(-window, window), -window - reach, window - 1 + reach])
    return offsets, window + torch.arange(window)


def _take(source: Tensor, index: Tensor) -> Tensor:
    """``source[index]`` for an index of any shape, through ``index_select`` (several times faster
    than advanced indexing on CPU for the scattered reads of a window)."""
    return source.index_select(0, index.reshape(-1)).view(*index.shape, *source.shape[1:])


def _insertion_points(
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


def _merge_sorted(
    keys: Tensor,
    rows: Tensor,
    new_keys: Tensor,
    new_rows: Tensor,
    before: Tensor,
    out_keys: Tensor,
    out_rows: Tensor,
) -> None:
    """Merge new entries (sorted, ``before`` from ``_insertion_points``) into the sorted arrays,
    writing ``out_keys`` and ``out_rows`` (length n + m) in O(n + m), for a bulk append (a prefill):
    the old entries fill the places the new ones leave, in order, with two boolean-mask copies per
    array and no per-entry Python loop."""
    is_new = np.zeros(keys.shape[0] + new_keys.shape[0], dtype=bool)
    is_new[(before + torch.arange(new_keys.shape[0])).numpy()] = True
    is_old = ~is_new
    for old, new, out in ((keys, new_keys, out_keys), (rows, new_rows, out_rows)):
        out = _raw(out)
        out[is_new] = _raw(new)
        out[is_old] = _raw(old)


def _insert_in_place(
    keys: Tensor, rows: Tensor, n: int, new_keys: Tensor, new_rows: Tensor, before: Tensor
) -> None:
    """Insert new entries (sorted, ``before`` from ``_insertion_points``) into sorted arrays that
    hold ``n`` entries and have room for the new ones, in place, for a buffer into a long array:
    the old entries between two insertion points move as one contiguous copy, right by the number
    of new entries before them, the last run first. m + 1 copies at memory speed, no mask and no
    new array: 1.5x faster than ``_merge_sorted`` at n = 1e6, m = 256 (docs/scalar_decoding.md)."""
    m = new_keys.shape[0]
    places = (before + torch.arange(m)).numpy()  # each new entry's place among old and new
    starts = before.tolist()
    for array, new in ((keys, new_keys), (rows, new_rows)):
        target, end = _raw(array), n
        for j in range(m - 1, -1, -1):
            # NumPy copies overlapping slices as if through a buffer (memmove).
            target[starts[j] + j + 1 : end + j + 1] = target[starts[j] : end]
            end = starts[j]
        target[places] = _raw(new)


def _raw(t: Tensor) -> np.ndarray:
    """A NumPy view of a 1-D tensor's bits (any dtype, bfloat16 included: the merge only moves them)."""
    return t.view(_SAME_WIDTH_INT[t.element_size()]).numpy()


_SAME_WIDTH_INT = {2: torch.int16, 4: torch.int32, 8: torch.int64}


class SortedScalarCache:
    """A decoding cache sorted by scalar key, for one sequence (seed 002 "The KV Cache is Sortable").

    ``num_heads`` H query heads, ``num_key_heads`` Hk scalar key heads (Hk = H: every head sorts by
    its own key; Hk = G: one designated sort head per value group, whose key the group's heads all
    search with their own queries, as seed 002 "Grouped Value Attention" describes), ``num_groups``
    G value groups of width ``value_dim``. ``vector_key_dim`` makes it a hybrid cache: each group also
    stores a vector key per token. ``sink_zone=(lo, hi)`` reserves a scalar range whose entries are
    never evicted nor merged (seed 002 "Sink zone reservation").
    """

    def __init__(
        self,
        num_heads: int,
        num_groups: int,
        value_dim: int,
        *,
        num_key_heads: int | None = None,
        vector_key_dim: int | None = None,
        buffer_size: int = 1024,
        eviction: GeometricEviction | None = None,
        merge: DensityMerge | None = None,
        sink_zone: tuple[float, float] | None = None,
        dtype: torch.dtype = torch.float32,
        capacity: int = 0,
    ):
        num_key_heads = num_heads if num_key_heads is None else num_key_heads
        for name, value in (
            ("num_heads", num_heads),
            ("num_groups", num_groups),
            ("num_key_heads", num_key_heads),
            ("value_dim", value_dim),
            ("buffer_size", buffer_size),
        ):
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if num_heads % num_key_heads:
            raise ValueError(
                f"num_key_heads={num_key_heads} does not divide num_heads={num_heads}: "
                "each query head must search exactly one key head"
            )
        if num_key_heads % num_groups:
            raise ValueError(
                f"num_groups={num_groups} does not divide num_key_heads={num_key_heads} "
                f"(nor, so, num_heads={num_heads}): G must divide H, and each key head must index "
                "exactly one value group"
            )
        if vector_key_dim is not None and not (isinstance(vector_key_dim, int) and vector_key_dim >= 1):
            raise ValueError(f"vector_key_dim must be None or an int >= 1, got {vector_key_dim!r}")
        if sink_zone is not None:
            lo, hi = sink_zone
            if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
                raise ValueError(
                    f"sink_zone must be a finite range (lo, hi) with lo <= hi, got {sink_zone!r}"
                )
        if not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating-point dtype, got {dtype}")
        self.num_heads, self.num_key_heads, self.num_groups = num_heads, num_key_heads, num_groups
        self.value_dim, self.vector_key_dim = value_dim, vector_key_dim
        self.buffer_size, self.eviction, self.merge, self.sink_zone = buffer_size, eviction, merge, sink_zone
        self.dtype = dtype
        self._store = _RowTables(num_groups, value_dim, vector_key_dim, dtype, capacity)
        self._buf_keys = torch.empty(num_key_heads, buffer_size, dtype=dtype)
        self._buf_rows = torch.empty(num_key_heads, buffer_size, dtype=torch.int32)
        self._orders = [_KeyOrder(self._buf_keys[h], self._buf_rows[h]) for h in range(num_key_heads)]
        self._pack()
        # The range of the queries of the last `recent` steps, per key head (geometric eviction).
        recent = eviction.recent if eviction is not None else 0
        self._recent_lo = torch.empty(num_key_heads, recent, dtype=dtype)
        self._recent_hi = torch.empty(num_key_heads, recent, dtype=dtype)
        self._recent_len = self._recent_next = 0
        self._next_position = 0
        self._laid_out = [0] * num_groups  # rows of each group's table at its last relayout

    # -- sizes ------------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Entries of the fullest key head (all equal unless eviction or merging acted per head)."""
        return max(len(order) for order in self._orders)

    def _group(self, key_head: int) -> int:
        """The value group whose rows a key head's entries point to."""
        return key_head // (self.num_key_heads // self.num_groups)

    def nbytes(self) -> int:
        """Bytes allocated by the cache (row tables at capacity, sorted arrays, buffers)."""
        total = sum(t.nbytes for t in self._store.tensors())
        packed = (self._keys, self._rows, self._last, self._buf_keys, self._buf_rows)
        return total + sum(t.nbytes for t in (*packed, self._recent_lo, self._recent_hi))

    def _pack(self) -> None:
        """Lay the sorted arrays out as rows of ``(Hk, width)`` tensors, padded with +inf keys (which
        keeps every row sorted), and point each key head's arrays at its row."""
        width = max(1, max(order.keys.shape[0] for order in self._orders))
        keys = torch.full((self.num_key_heads, width), math.inf, dtype=self.dtype)
        rows = torch.zeros(self.num_key_heads, width, dtype=torch.int32)
        for h, order in enumerate(self._orders):
            n = order.keys.shape[0]
            keys[h, :n], rows[h, :n] = order.keys, order.rows
            order.keys, order.rows = keys[h, :n], rows[h, :n]
        self._set_packed(keys, rows, [order.keys.shape[0] for order in self._orders])

    def _set_packed(self, keys: Tensor, rows: Tensor, lengths: list[int]) -> None:
        """Adopt packed ``(Hk, width)`` sorted arrays holding ``lengths`` entries per key head, and
        what a decoding step derives from the lengths (computed here once, not at every step)."""
        self._keys, self._rows, self._sizes = keys, rows, lengths
        # (Hk, 1, 1): the last place a step may read (a row without entries reads its +inf padding)
        self._last = (torch.tensor(lengths) - 1).clamp(min=0)[:, None, None]
        self._row_start = (torch.arange(self.num_key_heads) * keys.shape[1])[:, None, None]
        self._search_reads = sum(math.ceil(math.log2(n + 1)) for n in lengths)

    # -- insertion --------------------------------------------------------------------------------

    def append(self, k_s: Tensor, v: Tensor, k_vec: Tensor | None = None, positions: Tensor | None = None):
        """Add tokens: ``k_s (L, Hk)``, ``v (L, G, Dv)``, hybrid ``k_vec (L, G, Dk)`` (a single token
        may drop the leading L). ``positions (L,)`` default to the running token count."""
        if k_s.dim() == 1:
            k_s, v = k_s[None], v[None]
            k_vec = None if k_vec is None else k_vec[None]
        L = k_s.shape[0]
        if k_s.shape != (L, self.num_key_heads):
            raise ValueError(f"k_s must have shape (L, {self.num_key_heads}) (L, Hk), got {tuple(k_s.shape)}")
        if v.shape != (L, self.num_groups, self.value_dim):
            raise ValueError(
                f"v must have shape ({L}, {self.num_groups}, {self.value_dim}) (L, G, Dv), "
                f"got {tuple(v.shape)}"
            )
        if self.vector_key_dim is None and k_vec is not None:
            raise ValueError("k_vec was given but the cache has no vector keys (vector_key_dim=None)")
        if self.vector_key_dim is not None:
            expected = (L, self.num_groups, self.vector_key_dim)
            if k_vec is None or k_vec.shape != expected:
                got = None if k_vec is None else tuple(k_vec.shape)
                raise ValueError(f"a hybrid cache needs k_vec of shape {expected} (L, G, Dk), got {got}")
        for name, t in (("k_s", k_s), ("v", v), ("k_vec", k_vec)):
            if t is not None and not torch.isfinite(t).all():
                raise ValueError(
                    f"{name} has NaN or infinite entries: the cache only holds finite keys and values"
                )
        if positions is None:
            last = self._next_position + L - 1
            positions = torch.arange(self._next_position, last + 1, dtype=torch.int32)
        elif positions.shape != (L,) or positions.is_floating_point():
            raise ValueError(
                f"positions must be an integer tensor of shape ({L},), "
                f"got {positions.dtype} {tuple(positions.shape)}"
            )
        else:
            last = int(positions.max()) if L else -1
            if L and int(positions.min()) < 0:
                raise ValueError(f"positions must be >= 0, got {int(positions.min())}")
        if last >= 2**31 - 1:
            raise ValueError(f"positions must lie below 2**31 - 1 (stored as int32), got {last}")
        self._next_position = max(self._next_position, last + 1)
        k_s, v, positions = k_s.to(self.dtype), v.to(self.dtype), positions.to(torch.int32)
        per_group = self.num_key_heads // self.num_groups
        first_rows = self._store.add_tokens(v, None if k_vec is None else k_vec.to(self.dtype), positions)
        first_rows = torch.tensor(
            [[first] for first in first_rows for _ in range(per_group)], dtype=torch.int32
        )
        new_rows = first_rows + torch.arange(L, dtype=torch.int32)  # (Hk, L)
        if self._orders[0].buf_len + L >= self.buffer_size:
            # A full buffer, or a prefill longer than it, is merged in one O(n + L log L) pass.
            self._merge_buffers(k_s.T, new_rows)
        else:
            start = self._orders[0].buf_len
            self._buf_keys[:, start : start + L] = k_s.T
            self._buf_rows[:, start : start + L] = new_rows
            for order in self._orders:
                order.buf_len += L

    def flush(self) -> None:
        """Merge the append buffers into the sorted arrays now, then apply eviction and merging (an
        append does this by itself whenever the buffers fill)."""
        self._merge_buffers(self._buf_keys[:, :0], self._buf_rows[:, :0])

    def _merge_buffers(self, more_keys: Tensor, more_rows: Tensor) -> None:
        """Merge each key head's buffer and ``more_keys (Hk, L)`` into the packed sorted arrays: in
        place while the new entries are few and fit in the arrays' +inf padding, else into new
        arrays with room for ``GROWTH`` times the entries (amortized O(1) copies per token)."""
        buffered = self._orders[0].buf_len
        new_keys = torch.cat([self._buf_keys[:, :buffered], more_keys], dim=1)
        new_rows = torch.cat([self._buf_rows[:, :buffered], more_rows], dim=1)
        m = new_keys.shape[1]
        lengths = [order.keys.shape[0] + m for order in self._orders]
        in_place = max(lengths) <= self._keys.shape[1] and m * SEGMENTS_PER_ENTRY <= min(lengths) - m
        if in_place:
            keys, rows = self._keys, self._rows
        else:
            width = max(1, int(max(lengths) * GROWTH))
            keys = torch.full((self.num_key_heads, width), math.inf, dtype=self.dtype)
            rows = torch.zeros(self.num_key_heads, width, dtype=torch.int32)  # +inf keys keep rows sorted
        for h, (order, n) in enumerate(zip(self._orders, lengths)):
            positions = self._store.positions[self._group(h)]
            sorted_new = _insertion_points(order.keys, order.rows, new_keys[h], new_rows[h], positions)
            if in_place:
                _insert_in_place(keys[h], rows[h], n - m, *sorted_new)
            else:
                _merge_sorted(order.keys, order.rows, *sorted_new, keys[h, :n], rows[h, :n])
            order.keys, order.rows, order.buf_len = keys[h, :n], rows[h, :n], 0
        self._set_packed(keys, rows, lengths)
        if self.eviction is not None or self.merge is not None:
            self._apply_policies()
            self._pack()
        self._relayout()

    def _relayout(self) -> None:
        """Rewrite a group's rows in the key order of its first key head once its table has doubled
        since the last time, so that the window's rows are (nearly) one contiguous run: a window of
        scattered rows costs a cache miss per row, which dominates a step at n = 1e6
        (docs/scalar_decoding.md). Doubling keeps the cost at O(1) row moves per token, amortized,
        and leaves at most the newer half of a table out of key order."""
        per_group, store = self.num_key_heads // self.num_groups, self._store
        for g in range(self.num_groups):
            if store.rows[g] < 2 * self._laid_out[g]:
                continue
            orders = self._orders[g * per_group : (g + 1) * per_group]
            new_row = store.permute(g, orders[0].rows)
            for order in orders:  # the buffers are empty: they were just merged
                order.rows.copy_(new_row[order.rows.long()])
            self._laid_out[g] = store.rows[g]

    def _sink(self, keys: Tensor) -> Tensor:
        if self.sink_zone is None:
            return torch.zeros_like(keys, dtype=torch.bool)
        return (keys >= self.sink_zone[0]) & (keys <= self.sink_zone[1])

    def _apply_policies(self) -> None:
        for h, order in enumerate(self._orders):
            value_group = self._group(h)
            if self.eviction is not None and self._recent_len:
                lo = self._recent_lo[h, : self._recent_len].min() - self.eviction.margin
                hi = self._recent_hi[h, : self._recent_len].max() + self.eviction.margin
                keep = ((order.keys >= lo) & (order.keys <= hi)) | self._sink(order.keys)
                order.keys, order.rows = order.keys[keep], order.rows[keep]
            if self.merge is not None and order.keys.shape[0] > self.merge.max_entries:
                self._density_merge(order, value_group)
        self._compact()

    def _density_merge(self, order: _KeyOrder, value_group: int) -> None:
        # seed 002 "Density-based compression": entries in one bin of width `width` become one entry.
        keys, rows = order.keys, order.rows.long()
        sink = self._sink(keys)
        bins = torch.floor(keys / self.merge.width)
        starts = torch.ones_like(sink)
        starts[1:] = (bins[1:] != bins[:-1]) | sink[1:] | sink[:-1]
        group = torch.cumsum(starts, 0) - 1  # (n,) run id of each entry
        runs = int(group[-1]) + 1
        if runs == keys.shape[0]:
            return
        store = self._store
        weight = store.counts_of(value_group, rows).exp()
        run_weight = torch.zeros(runs, dtype=keys.dtype).index_add_(0, group, weight)

        def weighted_mean(x: Tensor) -> Tensor:
            x = x if x.dim() == 2 else x[:, None]
            sums = torch.zeros(runs, x.shape[1], dtype=x.dtype).index_add_(0, group, x * weight[:, None])
            return sums / run_weight[:, None]

        run_size = torch.bincount(group, minlength=runs)
        merged = run_size > 1
        new_keys = weighted_mean(keys)[:, 0]
        first = torch.nonzero(starts).flatten()  # first entry of each run
        run_positions = torch.full((runs,), torch.iinfo(torch.int32).max, dtype=torch.int32)
        run_positions = run_positions.scatter_reduce(0, group, store.positions[value_group][rows], "amin")
        new_rows = order.rows[first].clone()
        first_row = store.add(
            value_group,
            weighted_mean(store.values[value_group][rows])[merged],
            None if store.vec_keys is None else weighted_mean(store.vec_keys[value_group][rows])[merged],
            run_positions[merged],
            run_weight[merged].log(),
        )
        new_rows[merged] = torch.arange(first_row, store.rows[value_group], dtype=torch.int32)
        new_keys = torch.where(merged, new_keys, keys[first])  # singletons keep their exact key
        order.keys, order.rows = new_keys, new_rows

    def _compact(self) -> None:
        """Drop rows no key head references, once they are at least half of a table."""
        per_group, store = self.num_key_heads // self.num_groups, self._store
        compacted = False
        for g in range(self.num_groups):
            orders = self._orders[g * per_group : (g + 1) * per_group]
            if store.rows[g] <= 2 * max(len(order) for order in orders):
                continue
            live = torch.zeros(store.rows[g], dtype=torch.bool)
            for order in orders:
                live[order.rows.long()] = True
                live[order.buf_rows[: order.buf_len].long()] = True
            if int(live.sum()) * 2 > store.rows[g]:
                continue
            new_row = store.keep(g, live)
            compacted = True
            for order in orders:
                order.rows = new_row[order.rows.long()]
                order.buf_rows[: order.buf_len] = new_row[order.buf_rows[: order.buf_len].long()]
        if compacted:
            store.fit()

    # -- reading ----------------------------------------------------------------------------------

    def entries(self, key_head: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Every entry of one key head, sorted entries first then the buffer: ``keys (n,)``,
        ``positions (n,)``, ``log_count (n,)``, ``values (n, Dv)``."""
        order, g, store = self._orders[key_head], self._group(key_head), self._store
        rows = torch.cat([order.rows, order.buf_rows[: order.buf_len]]).long()
        keys = torch.cat([order.keys, order.buf_keys[: order.buf_len]])
        return keys, store.positions[g][rows].long(), store.counts_of(g, rows), store.values[g][rows]

    def _check_query(self, q_s, tau, window, q_vec) -> Tensor:
        H = self.num_heads
        if not (isinstance(window, int) and window >= 1):
            raise ValueError(
                f"window must be an int >= 1 (the number of nearest keys to read), got {window!r}"
            )
        if not (isinstance(q_s, Tensor) and q_s.shape == (H,)):
            raise ValueError(f"q_s must be a tensor of shape ({H},) (one scalar query per head), got {q_s!r}")
        if not torch.isfinite(q_s).all():
            raise ValueError("q_s has NaN or infinite entries")
        tau = torch.as_tensor(tau, dtype=self.dtype)
        if tau.shape not in ((), (H,)):
            raise ValueError(f"tau must be a float or a tensor of shape ({H},), got shape {tuple(tau.shape)}")
        if not torch.isfinite(tau.log()).all():  # exactly when 0 < tau < inf (and not NaN)
            raise ValueError(f"tau must be finite and > 0 for every head, got {tau.tolist()}")
        if self.vector_key_dim is not None:
            if q_vec is None or q_vec.shape != (H, self.vector_key_dim):
                got = None if q_vec is None else tuple(q_vec.shape)
                raise ValueError(
                    f"a hybrid cache needs q_vec of shape ({H}, {self.vector_key_dim}), got {got}"
                )
            if not torch.isfinite(q_vec).all():
                raise ValueError("q_vec has NaN or infinite entries")
        elif q_vec is not None:
            raise ValueError("q_vec was given but the cache has no vector keys (vector_key_dim=None)")
        buffered = self._orders[0].buf_len
        empty = [h for h, n in enumerate(self._sizes) if n + buffered == 0]
        if len(empty) == len(self._orders):
            raise ValueError("the cache is empty: append at least one token before decoding")
        if empty:
            raise ValueError(f"the cache is empty for key heads {empty} (eviction removed every entry)")
        return tau.expand(H)

    def decode(
        self,
        q_s: Tensor,
        tau: Tensor | float,
        window: int,
        *,
        q_vec: Tensor | None = None,
        scale: float | None = None,
    ) -> DecodeStep:
        """Attend one query per head (``q_s (H,)``, hybrid ``q_vec (H, Dk)``) over the ``window``
        entries nearest ``q_s`` in its key head, with their scores exactly as dense attention has
        them; returns the output and a bound on the mass outside the window."""
        tau = self._check_query(q_s, tau, window, q_vec)
        H, Hk, G = self.num_heads, self.num_key_heads, self.num_groups
        per_key, per_group = H // Hk, H // G  # query heads per key head, per value group
        q = q_s.to(self.dtype).reshape(Hk, per_key).contiguous()
        neg_inv_tau = -1.0 / tau.view(Hk, per_key, 1)
        if q_vec is not None:
            q_vec = q_vec.to(self.dtype)
            scale = self.vector_key_dim**-0.5 if scale is None else scale
        if self.eviction is not None:
            self._remember(q)
        # Every key head at once: binary search, then one read of the slice of `window` places either
        # side of the insertion point (which holds the window nearest sorted keys) and of the bound's
        # block edges (below). The window's entries are contiguous: the slice is read as pairs
        # (t, t + window), whose left member is nearer exactly for the left members that belong to
        # the window, so counting those pairs places it without sorting.
        longest, two_w = max(self._sizes), 2 * window
        blocks = math.ceil(math.log2(longest / window + 1)) + 1 if longest > window else 1
        offsets, places = _offsets(window, blocks)
        spots = torch.searchsorted(self._keys, q)[..., None] + offsets  # (Hk, per_key, 2 window + 2 blocks)
        read = spots.clamp(min=0).clamp_(max=self._last)
        flat = read + self._row_start
        # Places outside the row (or in its padding) are at an infinite distance.
        square = torch.where(read == spots, (q[..., None] - torch.take(self._keys, flat)).square_(), math.inf)
        slice_square = square[..., :two_w]
        from_left = (slice_square[..., :window] < slice_square[..., window:]).sum(dim=2, keepdim=True)
        chosen = places - from_left  # (Hk, per_key, window) places in the slice
        window_square = slice_square.gather(2, chosen)
        rows = torch.take(self._rows, flat.gather(2, chosen))
        left_out = slice_square.scatter(2, chosen, math.inf)  # the slice's entries outside the window
        # The append buffer's entries (at most buffer_size, not yet sorted) are all in the window.
        buffered = self._orders[0].buf_len
        if buffered:
            buffer_square = (q[..., None] - self._buf_keys[:, None, :buffered]).square_()
            window_square = torch.cat([window_square, buffer_square], 2)
            rows = torch.cat([rows, self._buf_rows[:, None, :buffered].expand(Hk, per_key, buffered)], 2)
        store = self._store
        rows = rows.view(G, per_group * rows.shape[2])  # each group reads its own table
        flat = store.flat(rows).view(-1)  # one read of every group's rows
        R = rows.shape[1] // per_group  # rows read per query head
        # seed 002: score = -(q_s - k_s)^2 / tau [+ scale <q, k>] (+ log count of merged entries);
        # places outside the cache have an infinite distance, so a score of -inf.
        scores = window_square.mul_(neg_inv_tau).view(H, 1, R)
        merged = store.log_count is not None
        if merged:
            scores = scores + _take(store.log_count.view(-1), flat).view_as(scores)
        if q_vec is not None:
            vec_keys = store.vec_keys.view(-1, self.vector_key_dim).index_select(0, flat)
            scores = scores + scale * torch.bmm(q_vec.view(H, 1, -1), vec_keys.view(H, R, -1).transpose(1, 2))
        top = scores.amax(dim=2, keepdim=True)
        shifted = scores - top
        weights = shifted.masked_fill_(shifted < EXP_FLOOR, -math.inf).exp_()  # (H, 1, R)
        inside_mass = weights.sum(dim=2).view(Hk, per_key)
        # bmm, not matmul: the same product in half the time for these small shapes (20 against 39 µs).
        values = store.values.view(-1, self.value_dim).index_select(0, flat).view(H, R, -1)
        output = torch.bmm(weights, values).view(H, -1).div_(inside_mass.view(H, 1))

        # The bound on the mass outside the window. Every score is at most
        # -d^2 / tau + [|scale| |q| max|k| (hybrid)] + max log count, for d a lower bound on the
        # entry's scalar distance: the exact distance of a candidate left out of the window, and for
        # the sorted entries beyond the candidates, blocks of doubling size (window, 2 window, ...)
        # each bounded by the distance of its inner edge: 2 log2(n / window) more key reads, and far
        # blocks, however many entries they hold, count for next to nothing.
        def per_key_head(per_table: list[float]) -> Tensor:
            return torch.tensor(per_table, dtype=self.dtype).repeat_interleave(Hk // G)[:, None]

        lift = top.view(Hk, per_key).neg()
        if merged:
            lift = lift + per_key_head(store.max_log_count)
        if q_vec is not None:
            max_norm = per_key_head(store.max_vec_norm)
            lift = lift + abs(scale) * q_vec.norm(dim=1).view(Hk, per_key) * max_norm
        if blocks > 1:
            # Edges start at the slice's outermost entries; block j holds the entries between edge j
            # and edge j + 1 (beyond the slice), all at least as far as edge j.
            edges = read[..., two_w:].view(Hk, per_key, 2, blocks)
            log_counts = edges.diff(dim=3).abs_().to(self.dtype).log_()
            edge_square = square[..., two_w:].view(Hk, per_key, 2, blocks)[..., :-1]
            block_terms = log_counts + edge_square * neg_inv_tau[..., None]
            terms = torch.cat([left_out.mul_(neg_inv_tau), block_terms.flatten(2)], 2)
        else:
            terms = left_out.mul_(neg_inv_tau)
        # Raising a term only loosens the bound, so raising the smallest to EXP_FLOOR below the
        # largest keeps it rigorous (and adds at most e^EXP_FLOOR per term).
        terms = torch.maximum(terms, terms.amax(dim=2, keepdim=True) + EXP_FLOOR)
        log_outside = torch.logsumexp(terms, dim=2) + lift
        bound = torch.sigmoid(log_outside - inside_mass.log()).view(H)
        keys_read = (
            per_key * self._search_reads
            + int((slice_square < math.inf).sum())
            + H * buffered
            + 2 * (blocks - 1) * H
        )
        rows_read = per_key * sum(min(window, n) for n in self._sizes) + H * buffered
        return DecodeStep(output, bound, keys_read, rows_read)

    def _remember(self, q: Tensor) -> None:
        """Record the range of this step's queries of each key head (``q (Hk, per_key)``)."""
        self._recent_lo[:, self._recent_next] = q.amin(dim=1)
        self._recent_hi[:, self._recent_next] = q.amax(dim=1)
        self._recent_next = (self._recent_next + 1) % self._recent_lo.shape[1]
        self._recent_len = min(self._recent_len + 1, self._recent_lo.shape[1])

    def dense_decode(
        self, q_s: Tensor, tau: Tensor | float, *, q_vec: Tensor | None = None, scale: float | None = None
    ) -> Tensor:
        """Dense attention over every entry of the cache (the reference the window is tested against)."""
        tau = self._check_query(q_s, tau, 1, q_vec)
        heads_per_key = self.num_heads // self.num_key_heads
        outputs = []
        for h_key, order in enumerate(self._orders):
            heads = slice(h_key * heads_per_key, (h_key + 1) * heads_per_key)
            g, store = self._group(h_key), self._store
            rows = torch.cat([order.rows, order.buf_rows[: order.buf_len]]).long()
            keys = torch.cat([order.keys, order.buf_keys[: order.buf_len]])
            outputs.append(
                scalar_attention_reference(
                    q_s[heads].to(self.dtype),
                    tau[heads],
                    keys[None],
                    store.values[g][rows][None],
                    log_count=store.counts_of(g, rows)[None],
                    q_vec=None if q_vec is None else q_vec[heads].to(self.dtype),
                    k_vec=None if q_vec is None else store.vec_keys[g][rows][None],
                    scale=scale,
                )
            )
        return torch.cat(outputs)
