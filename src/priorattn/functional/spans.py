"""The keys each query can reach, as runs of key indices, and the kernel calls that visit only them.

When key positions and key document ids are non-decreasing along each row (packed sequences, KV
caches, the defaults), the keys query i may see are one run ``lo[i] <= j < hi[i]`` of key
indices, padding aside: causal order and a window bound the run by position, a document by the
run of its id. The routes then visit only those keys:

- a packed row is block-diagonal: each document's queries form one run of constant ``lo``, which
  one mask-free kernel call covers (full, or bottom-right causal), so nothing of size
  ``Lq x Lk`` is built or saved;
- a sliding window moves ``lo`` with every query: bands of queries are taken against the key span
  they reach, with a mask of the band's size only, so local attention costs ``O(L * w)``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum

import torch
import torch.nn.functional as F
from torch import Tensor

from .masks import Masking, values_are_free

#: A run of queries sharing their first key gets its own mask-free call from this many queries on
#: (or when it is all the queries); shorter runs (tiny documents, window edges) join masked bands.
MIN_FLAT_ROWS = 64
#: Queries per masked band, at least (a window's band takes ``window`` queries if that is more):
#: a band of ``b`` queries reaches ``b + window - 1`` keys, so bands near ``window`` waste at most
#: half their cells, and fewer, larger calls keep the kernel efficient.
MIN_BAND_ROWS = 128


def key_spans(masking: Masking) -> tuple[Tensor, Tensor] | None:
    """``(lo, hi)``, each ``(B or 1, Lq)`` int64: query i may see keys ``lo[i] <= j < hi[i]`` only
    (and of those, every key that is not padding); ``hi <= lo`` means none.

    None when the visible keys are not one run (key positions or key document ids that decrease
    along a row), and where reading the masks' values is not free (:func:`~.masks.values_are_free`:
    on an accelerator or under ``torch.compile``): the routes then take dense masks in chunks.
    """
    if not values_are_free(masking.k_pos):
        return None
    q_pos, k_pos = masking.q_pos, masking.k_pos
    B = max(q_pos.shape[0], k_pos.shape[0], 1 if masking.q_doc is None else masking.q_doc.shape[0])
    Lq, Lk = q_pos.shape[-1], k_pos.shape[-1]
    q_pos, k_pos = q_pos.expand(B, Lq).contiguous(), k_pos.expand(B, Lk).contiguous()
    ordered = (k_pos[:, 1:] >= k_pos[:, :-1]).all()
    if masking.q_doc is not None:
        ordered &= (masking.k_doc[:, 1:] >= masking.k_doc[:, :-1]).all()
    if not bool(ordered):
        return None
    lo = q_pos.new_zeros(B, Lq)
    hi = q_pos.new_full((B, Lq), Lk)
    if masking.causal:  # k_pos[j] <= q_pos[i]
        hi = torch.minimum(hi, torch.searchsorted(k_pos, q_pos, right=True))
    if masking.window is not None:  # q_pos[i] - window < k_pos[j] (< q_pos[i] + window when not causal)
        lo = torch.maximum(lo, torch.searchsorted(k_pos, q_pos - masking.window, right=True))
        if not masking.causal:
            hi = torch.minimum(hi, torch.searchsorted(k_pos, q_pos + masking.window))
    if masking.q_doc is not None:  # the run of the query's document among the keys
        k_doc, q_doc = masking.k_doc.contiguous(), masking.q_doc.contiguous()
        lo = torch.maximum(lo, torch.searchsorted(k_doc, q_doc))
        hi = torch.minimum(hi, torch.searchsorted(k_doc, q_doc, right=True))
    return lo, hi


def visible_counts(masking: Masking, spans: tuple[Tensor, Tensor] | None) -> Tensor:
    """Number of keys each query sees, ``(B or 1, Lq)`` (SSMax's ``n_i``): from the key spans in
    O(L) when there are some, else by counting :meth:`Masking.visible_keys`."""
    if spans is None:
        return masking.visible_keys()
    lo, hi = spans
    hi = torch.maximum(hi, lo)
    if masking.key_padding is None:
        return hi - lo
    padded = F.pad(masking.key_padding.long().cumsum(-1), (1, 0))  # padded[b, j]: padding keys before j
    B = max(lo.shape[0], padded.shape[0])
    lo, hi, padded = lo.expand(B, -1), hi.expand(B, -1), padded.expand(B, -1)
    return hi - lo - (padded.gather(-1, hi) - padded.gather(-1, lo))


class Kind(Enum):
    """How one kernel call masks its block of queries and keys."""

    FULL = "full"  # every query sees every key of the block
    CAUSAL = "causal"  # bottom-right causal: query r of n sees the first lk - n + 1 + r keys
    MASKED = "masked"  # a boolean mask of the block's size


@dataclass(frozen=True)
class Call:
    """One kernel call: query ``rows`` against key ``cols``; ``mask`` ``(B or 1, 1, lq, lk)`` when
    MASKED. Rows that no call covers see no key."""

    rows: slice
    cols: slice
    kind: Kind
    mask: Tensor | None = None


def cut(start: int, stop: int, step: int | None) -> list[slice]:
    """``[start, stop)`` in runs of at most ``step`` (None: one run)."""
    step = step or max(stop - start, 1)
    return [slice(s, min(s + step, stop)) for s in range(start, stop, step)]


def band_calls(
    lo: list[int],
    hi: list[int],
    spans: tuple[Tensor, Tensor, Tensor | None],
    start: int,
    stop: int,
    band: int,
    cells: int,
) -> list[Call]:
    """Masked calls over queries ``[start, stop)``: bands of at most ``band`` queries and ``cells``
    mask cells, each against the keys its queries reach."""
    lo_t, hi_t, padding = spans
    calls = []
    while start < stop:
        end = min(start + band, stop)
        while True:
            c0, c1 = min(lo[start:end]), max(hi[start:end])
            if end - start == 1 or (end - start) * (c1 - c0) <= cells:
                break
            end = start + (end - start) // 2
        if c1 > c0:
            keys = torch.arange(c0, c1, device=lo_t.device)
            mask = (keys >= lo_t[start:end, None]) & (keys < hi_t[start:end, None])
            if padding is not None:
                mask &= ~padding[c0:c1]
            calls.append(Call(slice(start, end), slice(c0, c1), Kind.MASKED, mask[None, None]))
        start = end
    return calls


def span_calls(
    lo_t: Tensor, hi_t: Tensor, padding: Tensor | None, window: int | None, step: int | None, cells: int
) -> list[Call]:
    """The calls of queries whose spans are ``lo_t``, ``hi_t`` ``(Lq,)``, keys padded where
    ``padding`` ``(Lk,)`` is True; no call covers more than ``step`` queries (None: no limit)."""
    Lq = lo_t.shape[0]
    if Lq == 0:
        return []
    starts = torch.cat([lo_t.new_zeros(1), (lo_t[1:] != lo_t[:-1]).nonzero().flatten() + 1])
    lengths = torch.diff(starts, append=starts.new_tensor([Lq]))
    flat = lengths >= min(MIN_FLAT_ROWS, Lq)
    # A run is one flat segment, or the stretch of short segments up to the next flat one.
    begins = flat | torch.cat([flat.new_ones(1), flat[:-1]])
    run_starts, run_flat = starts[begins].tolist(), flat[begins].tolist()
    lo, hi = lo_t.tolist(), hi_t.tolist()
    padded = None if padding is None else [0, *padding.cumsum(0).tolist()]
    band = min(max(MIN_BAND_ROWS, window or 0), step or Lq)
    spans = (lo_t, hi_t, padding)
    calls = []
    for r0, r1, is_flat in zip(run_starts, [*run_starts[1:], Lq], run_flat):
        if not is_flat:
            calls += band_calls(lo, hi, spans, r0, r1, band, cells)
            continue
        c0 = lo[r0]
        for rows in cut(r0, r1, step):
            a, b = rows.start, rows.stop
            c1 = max(hi[a:b])
            if c1 <= c0:
                continue
            clean = padded is None or padded[c1] == padded[c0]
            if clean and min(hi[a:b]) == c1:
                calls.append(Call(rows, slice(c0, c1), Kind.FULL))
            elif clean and c1 - c0 >= b - a and hi[a:b] == list(range(c1 - (b - a) + 1, c1 + 1)):
                calls.append(Call(rows, slice(c0, c1), Kind.CAUSAL))
            else:
                calls += band_calls(lo, hi, spans, a, b, b - a, cells)
    return calls


def batch_groups(masking: Masking, lo: Tensor, hi: Tensor) -> list[Tensor] | None:
    """Batch rows that share their spans and padding, as index tensors; None: all rows share them."""
    B = masking.key_padding.shape[0] if masking.key_padding is not None else lo.shape[0]
    if B == 1:
        return None
    Lq = lo.shape[-1]
    layout = [lo.expand(B, Lq), hi.expand(B, Lq)]
    if masking.key_padding is not None:
        layout.append(masking.key_padding.long())
    rows, group = torch.unique(torch.cat(layout, dim=-1), dim=0, return_inverse=True)
    if rows.shape[0] == 1:
        return None
    return [(group == g).nonzero().flatten() for g in range(rows.shape[0])]


def select_rows(masking: Masking, index: Tensor) -> Masking:
    """The masks of batch rows ``index``; positions shared by the batch stay shared."""

    def rows(t: Tensor | None) -> Tensor | None:
        return t if t is None or t.shape[0] == 1 else t[index]

    return dataclasses.replace(
        masking,
        q_pos=rows(masking.q_pos),
        k_pos=rows(masking.k_pos),
        q_doc=rows(masking.q_doc),
        k_doc=rows(masking.k_doc),
        key_padding=rows(masking.key_padding),
    )
