"""Generation through the sorted scalar-key cache (seed 002 "Binary Search at Inference").

After the prompt is prefilled with the ordinary :class:`~priorattn.KVCache`, each scalar attention
layer's cache is moved into a :class:`~priorattn.scalar.SortedScalarCache`; every later token is
appended to it and its query attends over the ``window`` entries nearest its scalar query, per head.
``GPT.generate(..., decoding="sorted", decoding_options=SortedDecoding(window))`` does this (see
:func:`priorattn.scalar.model.sorted_caches`); docs/scalar_decoding.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..layers import KVCache
from .sorted_cache import SortedScalarCache


@dataclass(frozen=True)
class SortedDecoding:
    """How generation reads the sorted cache: the ``window`` nearest scalar keys per head, and the
    append buffer's size (its entries all join every window until it is merged)."""

    window: int
    buffer_size: int = 256

    def __post_init__(self):
        for name in ("window", "buffer_size"):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                raise ValueError(f"SortedDecoding.{name} must be an int >= 1, got {value!r}")


class SortedLayerCache:
    """The cache of one layer's scalar heads during sorted-cache generation (one sequence). Unlike a
    ``KVCache``, it is updated in place: each step appends to it, so continuations cannot branch
    from one prefilled cache.

    ``worst_outside_bound (H,)`` is the largest bound on the attention mass left outside the window
    over every step so far (:attr:`~priorattn.scalar.DecodeStep.mass_outside_bound`): each step's
    output is its exact attention's up to ``2 x bound x max|v|`` per head.
    """

    def __init__(self, layer, kv: KVCache, decoding: SortedDecoding):
        B, G, Lc, _ = kv.k.shape
        if B != 1:
            raise ValueError(
                f"sorted-cache decoding holds one sequence, got a batch of {B}: generate each prompt alone"
            )
        H, Dq, dtype = layer.num_heads, layer.content_dim, kv.v.dtype
        self.num_heads, self.window, self.tokens = H, decoding.window, Lc
        self.cache = SortedScalarCache(
            H,
            G,
            layer.head_dim,
            vector_key_dim=Dq or None,
            buffer_size=decoding.buffer_size,
            dtype=dtype,
            capacity=Lc + decoding.buffer_size + 1,
        )
        if layer.sink_value is not None:  # the sink is one more key, seen by every query (seed 002)
            self.cache.append(
                torch.full((H,), layer.sink_key, dtype=dtype),
                layer.sink_value.detach().to(dtype),
                torch.zeros(G, Dq, dtype=dtype) if Dq else None,  # the hybrid sink's vector key is 0
            )
        keys = kv.k[0].transpose(0, 1)  # (Lc, G, Dq + m)
        self.cache.append(
            keys[..., Dq:].reshape(Lc, H),  # head g m + r is lane r of group g
            kv.v[0].transpose(0, 1),
            keys[..., :Dq] if Dq else None,
        )
        self.worst_outside_bound = torch.zeros(H, dtype=dtype)

    def __len__(self) -> int:
        """Tokens seen (the sink not counted), as ``len(KVCache)``."""
        return self.tokens

    def check_layer(self, layer, batch: int) -> None:
        if layer.num_heads != self.num_heads or batch != 1:
            raise ValueError(
                f"this sorted cache holds {self.num_heads} heads of one sequence, got a layer of "
                f"{layer.num_heads} heads and a batch of {batch}"
            )

    def step(
        self,
        k_s: Tensor,
        v: Tensor,
        q_s: Tensor,
        tau: Tensor,
        *,
        k_vec: Tensor | None = None,
        q_vec: Tensor | None = None,
    ) -> Tensor:
        """Append one token (``k_s (H,)``, ``v (G, D)``, hybrid ``k_vec (G, Dq)``), then attend its
        query (``q_s (H,)``, ``tau`` ``()`` or ``(H,)``, hybrid ``q_vec (H, Dq)``); returns ``(H, D)``."""
        self.cache.append(k_s, v, k_vec)
        self.tokens += 1
        step = self.cache.decode(q_s, tau, self.window, q_vec=q_vec)
        self.worst_outside_bound = torch.maximum(self.worst_outside_bound, step.mass_outside_bound)
        return step.output


__all__ = ["SortedDecoding", "SortedLayerCache"]
