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

Modules, each importing only those listed before it: :mod:`.rows` (the row tables), :mod:`.key_order`
(the sorted arrays, their packing and the merge), :mod:`.policies` (eviction, density merging, the
sink zone), :mod:`.decode` (a step and its bound; the dense definition), :mod:`.cache`
(:class:`SortedScalarCache`).
"""

from .cache import SortedScalarCache
from .decode import DecodeStep, scalar_attention_reference
from .policies import DensityMerge, GeometricEviction

__all__ = [
    "DecodeStep",
    "DensityMerge",
    "GeometricEviction",
    "SortedScalarCache",
    "scalar_attention_reference",
]
