"""Which keys each query may see: causal order, documents, padding and a sliding window.

All masks are defined on positions, not indices, so a query block of a KV-cache decode step sees
exactly what it would see in the full forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

#: Largest number of (query, key) cells a mask is built for at once when counting visible keys.
COUNT_CHUNK_CELLS = 1 << 22


def values_are_free(t: Tensor) -> bool:
    """Whether reading ``t``'s values on the host costs nothing: on the CPU, outside ``torch.compile``.

    Routes may read small tensors (positions, document ids) to pick a faster exact kernel. On an
    accelerator such a read waits for the device queue to drain, and under ``torch.compile`` it
    breaks the graph; there the routes decide from shapes and arguments alone and take the general
    path, which gives the same result.
    """
    return t.device.type == "cpu" and not torch.compiler.is_compiling()


def run_start(pos: Tensor) -> int | None:
    """``pos[0, 0]`` when ``pos`` is one run ``start, start + 1, ...`` shared by the batch, else None
    (also when its values are not free to read, see :func:`values_are_free`)."""
    if pos.shape[0] != 1 or pos.shape[-1] == 0 or not values_are_free(pos):
        return None
    start = int(pos[0, 0])
    return start if torch.equal(pos[0], start + torch.arange(pos.shape[-1], device=pos.device)) else None


@dataclass(frozen=True)
class Masking:
    """The masks of one attention call, on ``(B or 1, L)`` positions and ``(B, L)`` document ids.

    ``starts`` is ``(q_pos[0, 0], k_pos[0, 0])`` when both positions are runs shared by the batch,
    else None. A caller that built them as runs (the defaults) says so; otherwise they are read
    back where that is free (:func:`run_start`), and elsewhere taken as general positions.
    """

    causal: bool
    q_pos: Tensor  # (B or 1, Lq) int64
    k_pos: Tensor  # (B or 1, Lk) int64
    q_doc: Tensor | None = None  # (B, Lq)
    k_doc: Tensor | None = None  # (B, Lk)
    key_padding: Tensor | None = None  # (B, Lk) bool, True marks a padding key
    window: int | None = None
    starts: tuple[int, int] | None = None

    def __post_init__(self):
        # Computed once here, not in cached properties: their lock is opaque to torch.compile.
        if self.starts is None:
            q0, k0 = run_start(self.q_pos), run_start(self.k_pos)
            if q0 is not None and k0 is not None:
                object.__setattr__(self, "starts", (q0, k0))

    @property
    def q_start(self) -> int | None:
        """``q_pos[0, 0]`` when both positions are known runs, else None."""
        return None if self.starts is None else self.starts[0]

    @property
    def k_start(self) -> int | None:
        """``k_pos[0, 0]`` when both positions are known runs, else None."""
        return None if self.starts is None else self.starts[1]

    @property
    def masks_anything(self) -> bool:
        return (
            self.causal or self.q_doc is not None or self.key_padding is not None or self.window is not None
        )

    @property
    def queries_are_newest_keys(self) -> bool:
        """Positions are one run shared by the batch, ``k = s + arange(Lk)``, and the queries are its
        last ``Lq`` entries: the default, or a shifted copy of it."""
        Lq, Lk = self.q_pos.shape[-1], self.k_pos.shape[-1]
        return self.starts is not None and self.starts[0] - self.starts[1] == Lk - Lq

    @property
    def plain_causal(self) -> bool:
        """Causal, queries are the newest keys, and nothing else is masked."""
        return (
            self.causal
            and self.q_doc is None
            and self.key_padding is None
            and self.window is None
            and self.queries_are_newest_keys
        )

    def visible(self, rows: slice | None = None, cols: slice | None = None) -> Tensor:
        """``(B or 1, 1, lq, lk)`` bool: True where query ``rows`` may attend to key ``cols`` (None: all)."""
        # None rather than a slice default: dynamo before torch 2.13 cannot wrap a default slice
        rows = slice(None) if rows is None else rows
        cols = slice(None) if cols is None else cols
        if self.plain_causal:  # key index <= query index + (Lk - Lq): a shifted lower triangle
            Lq, Lk = self.q_pos.shape[-1], self.k_pos.shape[-1]
            r0, r1, _ = rows.indices(Lq)
            c0, c1, _ = cols.indices(Lk)
            ones = torch.ones(r1 - r0, c1 - c0, dtype=torch.bool, device=self.q_pos.device)
            return ones.tril_(r0 - c0 + Lk - Lq)[None, None]
        q_pos, k_pos = self.q_pos[:, rows], self.k_pos[:, cols]
        keep = self.lag_visible(q_pos[:, :, None] - k_pos[:, None, :])
        if self.q_doc is not None:
            keep = keep & (self.q_doc[:, rows, None] == self.k_doc[:, None, cols])
        if self.key_padding is not None:
            keep = keep & ~self.key_padding[:, None, cols]
        return keep[:, None]

    def lag_visible(self, lag: Tensor) -> Tensor:
        """Bool like ``lag``: whether causal order and the window let a query see a key ``lag`` behind it."""
        keep = torch.ones_like(lag, dtype=torch.bool)
        if self.causal:
            keep &= lag >= 0
        if self.window is not None:
            keep &= (lag if self.causal else lag.abs()) < self.window
        return keep

    def visible_keys(self) -> Tensor:
        """Number of keys each query sees, ``(B or 1, Lq)``: the ``n_i`` of SSMax."""
        Lq, Lk = self.q_pos.shape[-1], self.k_pos.shape[-1]
        device = self.q_pos.device
        if self.plain_causal:  # query i sees keys 0 .. i + Lk - Lq: counted, not masked cell by cell
            return torch.arange(Lk - Lq + 1, Lk + 1, device=device)[None]
        if not self.masks_anything:
            return torch.full((1, Lq), Lk, dtype=torch.long, device=device)
        step = max(1, COUNT_CHUNK_CELLS // max(Lk, 1))
        counts = [self.visible(slice(s, s + step)).sum(-1)[:, 0] for s in range(0, Lq, step)]
        return torch.cat(counts, dim=-1)
