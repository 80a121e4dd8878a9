"""The sorted cache, :class:`SortedScalarCache`: validates its input, appends tokens to the row store
(:mod:`.rows`) and each key head's append buffer, merges full buffers into the sorted arrays
(:mod:`.key_order`), applies the policies (:mod:`.policies`), keeps the row tables compact and in
key order, and decodes (:mod:`.decode`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .decode import DecodeStep, decode_step, scalar_attention_reference
from .key_order import (
    SEGMENTS_PER_ENTRY,
    KeyOrder,
    PackedKeys,
    insert_in_place,
    insertion_points,
    merge_sorted,
)
from .policies import DensityMerge, GeometricEviction, density_merge, evict_outside
from .rows import GROWTH, RowTables


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
        self._store = RowTables(num_groups, value_dim, vector_key_dim, dtype, capacity)
        self._buf_keys = torch.empty(num_key_heads, buffer_size, dtype=dtype)
        self._buf_rows = torch.empty(num_key_heads, buffer_size, dtype=torch.int32)
        self._orders = [KeyOrder(self._buf_keys[h], self._buf_rows[h]) for h in range(num_key_heads)]
        self._packed = PackedKeys.pack(self._orders, dtype)
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
        packed = (self._packed.keys, self._packed.rows, self._packed.last, self._buf_keys, self._buf_rows)
        return total + sum(t.nbytes for t in (*packed, self._recent_lo, self._recent_hi))

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
        in_place = max(lengths) <= self._packed.keys.shape[1] and m * SEGMENTS_PER_ENTRY <= min(lengths) - m
        if in_place:
            keys, rows = self._packed.keys, self._packed.rows
        else:
            width = max(1, int(max(lengths) * GROWTH))
            keys = torch.full((self.num_key_heads, width), math.inf, dtype=self.dtype)
            rows = torch.zeros(self.num_key_heads, width, dtype=torch.int32)  # +inf keys keep rows sorted
        for h, (order, n) in enumerate(zip(self._orders, lengths)):
            positions = self._store.positions[self._group(h)]
            sorted_new = insertion_points(order.keys, order.rows, new_keys[h], new_rows[h], positions)
            if in_place:
                insert_in_place(keys[h], rows[h], n - m, *sorted_new)
            else:
                merge_sorted(order.keys, order.rows, *sorted_new, keys[h, :n], rows[h, :n])
            order.keys, order.rows, order.buf_len = keys[h, :n], rows[h, :n], 0
        self._packed = PackedKeys(keys, rows, lengths)
        if self.eviction is not None or self.merge is not None:
            self._apply_policies()
            self._packed = PackedKeys.pack(self._orders, self.dtype)
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

    def _apply_policies(self) -> None:
        for h, order in enumerate(self._orders):
            value_group = self._group(h)
            if self.eviction is not None and self._recent_len:
                lo = self._recent_lo[h, : self._recent_len].min() - self.eviction.margin
                hi = self._recent_hi[h, : self._recent_len].max() + self.eviction.margin
                evict_outside(order, lo, hi, self.sink_zone)
            if self.merge is not None and order.keys.shape[0] > self.merge.max_entries:
                density_merge(order, self._store, value_group, self.merge.width, self.sink_zone)
        self._compact()

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
        empty = [h for h, n in enumerate(self._packed.sizes) if n + buffered == 0]
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
        Hk = self.num_key_heads
        q = q_s.to(self.dtype).reshape(Hk, self.num_heads // Hk).contiguous()  # (Hk, per_key)
        if q_vec is not None:
            q_vec = q_vec.to(self.dtype)
            scale = self.vector_key_dim**-0.5 if scale is None else scale
        if self.eviction is not None:
            self._remember(q)
        buffered = self._orders[0].buf_len
        buffer = self._buf_keys[:, :buffered], self._buf_rows[:, :buffered]
        return decode_step(self._packed, buffer, self._store, q, tau, window, q_vec, scale)

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
