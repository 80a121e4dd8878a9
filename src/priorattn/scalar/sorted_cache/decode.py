"""One decoding step of the sorted cache (seed 002 "Binary Search at Inference"): the ``window``
entries nearest each query's scalar, attended exactly, and a rigorous upper bound on the attention
mass left outside them; and the dense definition the step is tested against.

A step scores query head ``h`` against entry ``j`` as ``-(q_s,h - k_s,j)^2 / tau_h [+ scale <q_h,
k_j>] + log c_j`` (the bracket for hybrid attention, ``c_j`` the tokens a merged entry stands for).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .key_order import PackedKeys
from .rows import RowTables, take

#: Weights below e^EXP_FLOOR of the window's largest are dropped: they are below float32 resolution,
#: and exp() of numbers under -87 gives float32 subnormals, which cost hundreds of times a normal
#: exp on x86. Dropping them moves an output by at most
#: window * e^-80 ~ 1e-32 of its scale.
EXP_FLOOR = -80.0


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


@functools.cache
def read_offsets(window: int, blocks: int) -> tuple[Tensor, Tensor]:
    """The places a step reads, as offsets from the insertion point: the slice ``-window .. window -
    1``, then the inner edges of ``blocks`` blocks of doubling size on each side (reaching ``0, w, 3w,
    7w, ...`` beyond the slice's outermost entries); and ``window + j``, the slice's right half."""
    reach = window * (2 ** torch.arange(blocks) - 1)
    offsets = torch.cat([torch.arange(-window, window), -window - reach, window - 1 + reach])
    return offsets, window + torch.arange(window)


def decode_step(
    packed: PackedKeys,
    buffer: tuple[Tensor, Tensor],
    store: RowTables,
    q: Tensor,
    tau: Tensor,
    window: int,
    q_vec: Tensor | None,
    scale: float | None,
) -> DecodeStep:
    """Attend the queries ``q (Hk, per_key)`` (each key head's query heads, in the store's dtype)
    with bandwidths ``tau (H,)`` over the ``window`` sorted entries nearest each in its key head
    (``packed``) and every entry of the append ``buffer`` (its keys and rows, ``(Hk, b)``), with
    their scores exactly as dense attention has them; hybrid with ``q_vec (H, Dk)`` and ``scale``.
    Returns the output and a bound on the mass outside the window."""
    Hk, per_key = q.shape
    H, G, dtype = Hk * per_key, len(store.rows), q.dtype
    per_group = H // G  # query heads per value group
    neg_inv_tau = -1.0 / tau.view(Hk, per_key, 1)
    buf_keys, buf_rows = buffer
    buffered = buf_keys.shape[1]
    # Every key head at once: binary search, then one read of the slice of `window` places either
    # side of the insertion point (which holds the window nearest sorted keys) and of the bound's
    # block edges (below). The window's entries are contiguous: the slice is read as pairs
    # (t, t + window), whose left member is nearer exactly for the left members that belong to
    # the window, so counting those pairs places it without sorting.
    longest, two_w = max(packed.sizes), 2 * window
    blocks = math.ceil(math.log2(longest / window + 1)) + 1 if longest > window else 1
    offsets, places = read_offsets(window, blocks)
    spots = torch.searchsorted(packed.keys, q)[..., None] + offsets  # (Hk, per_key, 2 window + 2 blocks)
    read = spots.clamp(min=0).clamp_(max=packed.last)
    flat = read + packed.row_start
    # Places outside the row (or in its padding) are at an infinite distance.
    square = torch.where(read == spots, (q[..., None] - torch.take(packed.keys, flat)).square_(), math.inf)
    slice_square = square[..., :two_w]
    from_left = (slice_square[..., :window] < slice_square[..., window:]).sum(dim=2, keepdim=True)
    chosen = places - from_left  # (Hk, per_key, window) places in the slice
    window_square = slice_square.gather(2, chosen)
    rows = torch.take(packed.rows, flat.gather(2, chosen))
    left_out = slice_square.scatter(2, chosen, math.inf)  # the slice's entries outside the window
    # The append buffer's entries (at most buffer_size, not yet sorted) are all in the window.
    if buffered:
        buffer_square = (q[..., None] - buf_keys[:, None]).square_()
        window_square = torch.cat([window_square, buffer_square], 2)
        rows = torch.cat([rows, buf_rows[:, None].expand(Hk, per_key, buffered)], 2)
    rows = rows.view(G, per_group * rows.shape[2])  # each group reads its own table
    flat = store.flat(rows).view(-1)  # one read of every group's rows
    R = rows.shape[1] // per_group  # rows read per query head
    # seed 002: score = -(q_s - k_s)^2 / tau [+ scale <q, k>] (+ log count of merged entries);
    # places outside the cache have an infinite distance, so a score of -inf.
    scores = window_square.mul_(neg_inv_tau).view(H, 1, R)
    merged = store.log_count is not None
    if merged:
        scores = scores + take(store.log_count.view(-1), flat).view_as(scores)
    if q_vec is not None:
        vec_keys = store.vec_keys.view(-1, q_vec.shape[-1]).index_select(0, flat)
        scores = scores + scale * torch.bmm(q_vec.view(H, 1, -1), vec_keys.view(H, R, -1).transpose(1, 2))
    top = scores.amax(dim=2, keepdim=True)
    shifted = scores - top
    weights = shifted.masked_fill_(shifted < EXP_FLOOR, -math.inf).exp_()  # (H, 1, R)
    inside_mass = weights.sum(dim=2).view(Hk, per_key)
    # bmm, not matmul: the same product in half the time for these small shapes.
    values = store.values.view(-1, store.values.shape[-1]).index_select(0, flat).view(H, R, -1)
    output = torch.bmm(weights, values).view(H, -1).div_(inside_mass.view(H, 1))

    # The bound on the mass outside the window. Every score is at most
    # -d^2 / tau + [|scale| |q| max|k| (hybrid)] + max log count, for d a lower bound on the
    # entry's scalar distance: the exact distance of a candidate left out of the window, and for
    # the sorted entries beyond the candidates, blocks of doubling size (window, 2 window, ...)
    # each bounded by the distance of its inner edge: 2 log2(n / window) more key reads, and far
    # blocks, however many entries they hold, count for next to nothing.
    def per_key_head(per_table: list[float]) -> Tensor:
        return torch.tensor(per_table, dtype=dtype).repeat_interleave(Hk // G)[:, None]

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
        log_counts = edges.diff(dim=3).abs_().to(dtype).log_()
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
        per_key * packed.search_reads
        + int((slice_square < math.inf).sum())
        + H * buffered
        + 2 * (blocks - 1) * H
    )
    rows_read = per_key * sum(min(window, n) for n in packed.sizes) + H * buffered
    return DecodeStep(output, bound, keys_read, rows_read)
