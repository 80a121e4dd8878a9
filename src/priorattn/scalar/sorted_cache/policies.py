"""The sorted cache's policies (seed 002 "Explicit Eviction Policies"), applied whenever the append
buffer is merged: geometric eviction, density merging, and the sink zone that both leave alone.

:class:`GeometricEviction` and :class:`DensityMerge` are the options a cache takes; the functions
act on one key head's sorted entries (:class:`~.key_order.KeyOrder`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .key_order import KeyOrder
from .rows import RowTables


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


def in_sink(keys: Tensor, sink_zone: tuple[float, float] | None) -> Tensor:
    """Whether each key lies in the sink zone ``[lo, hi]`` (seed 002 "Sink zone reservation"), whose
    entries are never evicted nor merged; all False without one."""
    if sink_zone is None:
        return torch.zeros_like(keys, dtype=torch.bool)
    return (keys >= sink_zone[0]) & (keys <= sink_zone[1])


def evict_outside(order: KeyOrder, lo: Tensor, hi: Tensor, sink_zone: tuple[float, float] | None) -> None:
    """Geometric eviction: drop the sorted entries whose key lies outside ``[lo, hi]`` and outside
    the sink zone."""
    keep = ((order.keys >= lo) & (order.keys <= hi)) | in_sink(order.keys, sink_zone)
    order.keys, order.rows = order.keys[keep], order.rows[keep]


def density_merge(
    order: KeyOrder, store: RowTables, value_group: int, width: float, sink_zone: tuple[float, float] | None
) -> None:
    """Density merging of one key head's sorted entries, whose rows are ``value_group``'s in
    ``store``: the entries of each run in one bin ``floor(k_s / width)`` (sink entries stay alone)
    become one new row, appended to the store; a singleton keeps its row and exact key."""
    # seed 002 "Density-based compression": entries in one bin of width `width` become one entry.
    keys, rows = order.keys, order.rows.long()
    sink = in_sink(keys, sink_zone)
    bins = torch.floor(keys / width)
    starts = torch.ones_like(sink)
    starts[1:] = (bins[1:] != bins[:-1]) | sink[1:] | sink[:-1]
    group = torch.cumsum(starts, 0) - 1  # (n,) run id of each entry
    runs = int(group[-1]) + 1
    if runs == keys.shape[0]:
        return
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
