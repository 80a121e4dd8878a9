"""The KV cache of :class:`~priorattn.layers.PriorMultiheadAttention`: the keys and values seen so
far, with their positions, documents, padding and the key-bias part's state, in buffers that grow in
place so that a decode step copies only its own entries."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..functional.sdpa import to_width


@dataclass
class _Buffers:
    """Storage that caches share: a cache of length ``n`` reads entries ``[0, n)``. Entries
    ``[0, filled)`` hold data; the rest, up to the capacity ``C``, is room to grow into."""

    k: Tensor  # (B, Hkv, C, max(Dq, D)), zero lanes past Dq once moved (see KVCache.padded_keys)
    v: Tensor  # (B, Hkv, C, D)
    positions: Tensor  # (B or 1, C)
    doc_ids: Tensor | None  # (B, C)
    key_padding_mask: Tensor | None  # (B, C)
    key_state: Tensor | None  # (B, H, C): each key's state of the layer's key-bias part (FoX's F_j)
    filled: int
    key_width: int  # Dq


class KVCache:
    """Keys and values seen so far, with what attention needs to mask and place them.

    Keys are stored after RoPE (a rotation depends only on the key's own position), so a decode step
    rotates only its new tokens. ``positions`` is ``(1, Lc)`` when every sequence shares them.
    ``key_padding_mask`` is kept so padding (e.g. left padding of a batched prompt) stays invisible
    to every later query; ``None`` means no key is padding. ``key_state`` ``(B, H, Lc)`` is what the
    layer's key-bias part keeps of each key (FoX's cumulative log forget gate ``F_j``,
    :class:`~priorattn.layers.ForgetGate`), ``None`` in a layer without one.

    The tensors are views of buffers with room to grow: :meth:`extend` writes a decode step's
    entries in place instead of copying the whole cache at every step (``torch.cat`` copies
    ``O(L^2)`` entries over a generation of ``L`` tokens; this copies each ``O(1)`` times).
    A cache never changes once made, so several continuations may branch from one prefix. Under
    autograd (keys or values that require grad) every extension gets new buffers of exactly its
    size, as concatenation did: a buffer autograd saved for the backward is never written again.

    Keys narrower than the values (a head whose prior folds into q/k lanes keeps ``D`` lanes for
    values and ``Dq < D`` for content) are kept with zero lanes up to ``D`` in the buffers that
    :meth:`extend` makes, for :meth:`padded_keys`: the CPU flash kernel wants one width for q, k
    and v, and padding every cached key at every decode step would copy the whole cache.
    """

    def __init__(
        self,
        k: Tensor,  # (B, Hkv, Lc, Dq), rotated
        v: Tensor,  # (B, Hkv, Lc, D)
        positions: Tensor,  # (B or 1, Lc) int64
        doc_ids: Tensor | None = None,  # (B, Lc)
        key_padding_mask: Tensor | None = None,  # (B, Lc) bool, True marks a padding key
        key_state: Tensor | None = None,  # (B, H, Lc), the key-bias part's (FoX: F_j, float64)
    ):
        buffers = _Buffers(
            k, v, positions, doc_ids, key_padding_mask, key_state, filled=k.shape[2], key_width=k.shape[-1]
        )
        self._view(buffers, k.shape[2])

    def _view(self, buffers: _Buffers, length: int) -> KVCache:
        self._buffers = buffers
        self.k, self.v = buffers.k[:, :, :length, : buffers.key_width], buffers.v[:, :, :length]
        self.positions = buffers.positions[:, :length]
        self.doc_ids = None if buffers.doc_ids is None else buffers.doc_ids[:, :length]
        padding = buffers.key_padding_mask
        self.key_padding_mask = None if padding is None else padding[:, :length]
        self.key_state = None if buffers.key_state is None else buffers.key_state[..., :length]
        return self

    def __len__(self) -> int:
        return self.k.shape[2]

    def padded_keys(self) -> Tensor:
        """The keys with zero lanes up to the values' width where they are narrower, ``(B, Hkv, Lc,
        max(Dq, D))``: zero lanes add nothing to ``<q, k>``. A view of the buffers :meth:`extend`
        made; a cache never extended (a prefill's) pads a copy."""
        keys = self._buffers.k[:, :, : len(self)]
        return keys if keys.shape[-1] >= self.v.shape[-1] else to_width(keys, self.v.shape[-1])

    def extend(self, new: KVCache) -> KVCache:
        """A cache holding these keys followed by ``new``'s; this cache stays as it is.

        ``new``'s entries go in place into the room after this cache's entries when this cache is
        the newest one on its buffers; otherwise (no room left, a branch from a cache that was
        extended already, another layout) into new buffers with room for half as many entries
        again, so the copies over a generation add up to a few times its length.
        """
        if (self.doc_ids is None) != (new.doc_ids is None):
            if self.doc_ids is None:
                state = "has no doc_ids but this call gives some"
            else:
                state = "has doc_ids but this call gives none"
            raise ValueError(f"the cache {state}: pass doc_ids on every call or on none")
        if (self.key_state is None) != (new.key_state is None):
            raise ValueError(
                "the cache and this call disagree on a key-bias part (FoX's forget gate): extend a "
                "cache of the same layer"
            )
        start, stop = len(self), len(self) + len(new)
        buffers = self._buffers if self._has_room_for(new) else self._moved(new, stop)
        buffers.k[:, :, start:stop, : buffers.key_width] = new.k
        buffers.v[:, :, start:stop] = new.v
        buffers.positions[:, start:stop] = new.positions
        if buffers.doc_ids is not None:
            buffers.doc_ids[:, start:stop] = new.doc_ids
        if buffers.key_padding_mask is not None:
            padding = new.key_padding_mask
            buffers.key_padding_mask[:, start:stop] = False if padding is None else padding
        if buffers.key_state is not None:
            buffers.key_state[..., start:stop] = new.key_state
        buffers.filled = stop
        return KVCache.__new__(KVCache)._view(buffers, stop)

    def _has_room_for(self, new: KVCache) -> bool:
        buffers = self._buffers
        return (
            buffers.filled == len(self)  # past it nothing is read: no other cache holds entries there
            and len(self) + len(new) <= buffers.k.shape[2]
            and not _autograd_records(self, new)
            and (new.k.dtype, new.v.dtype) == (buffers.k.dtype, buffers.v.dtype)
            and new.positions.shape[0] <= buffers.positions.shape[0]
            and (new.key_padding_mask is None or buffers.key_padding_mask is not None)
        )

    def _moved(self, new: KVCache, stop: int) -> _Buffers:
        """New buffers holding this cache's entries, with room for ``stop`` entries and more."""
        # A buffer that autograd may have saved must not be written again: no room in it.
        capacity = stop if _autograd_records(self, new) else stop + stop // 2
        n = len(self)

        def buffer(old: Tensor, other: Tensor, rows: int, dim: int) -> Tensor:
            shape = [rows, *old.shape[1:]]
            shape[dim] = capacity
            dtype = torch.promote_types(old.dtype, other.dtype)
            out = old.new_empty(shape, dtype=dtype)
            out.narrow(dim, 0, n).copy_(old)
            return out

        B = self.k.shape[0]
        keys = buffer(self.padded_keys(), new.k, B, 2)
        keys[:, :, n:].zero_()  # the new entries' lanes past Dq stay zero: extend writes Dq lanes
        padding = None
        if self.key_padding_mask is not None or new.key_padding_mask is not None:
            padding = torch.zeros(B, capacity, dtype=torch.bool, device=self.k.device)
            if self.key_padding_mask is not None:
                padding[:, :n] = self.key_padding_mask
        rows = max(self.positions.shape[0], new.positions.shape[0])  # positions shared or per sequence
        return _Buffers(
            keys,
            buffer(self.v, new.v, B, 2),
            buffer(self.positions.expand(rows, -1), new.positions, rows, 1),
            None if self.doc_ids is None else buffer(self.doc_ids, new.doc_ids, B, 1),
            padding,
            None if self.key_state is None else buffer(self.key_state, new.key_state, B, 2),
            filled=n,
            key_width=self._buffers.key_width,
        )


def _autograd_records(*caches: KVCache) -> bool:
    """Whether writing into these caches' buffers could change tensors autograd saved."""
    tensors = [t for c in caches for t in (c.k, c.v, c.key_state) if t is not None]
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
