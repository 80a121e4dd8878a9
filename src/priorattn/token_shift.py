"""Token shift: every position also gets its predecessor's embedding, ``h_t = e_t + W e_{t-1}``.

RWKV's token shift (Peng et al., 2023) and the "smeared keys" of Olsson et al. (2022): with the
previous token's features at every position, a key can say which token came before it, so an
induction head (find the earlier occurrence of the current token, read what followed it) is one
attention hop instead of two layers. A synthetic retrieval study can then compare only what the
positional mechanisms differ in: whether attention still finds the needle far beyond ``T``.

The shift never crosses a document of a packed row (``e_{t-1}`` counts as zero where ``doc_ids``
changes) nor the start of a sequence. A model that decodes through a KV cache carries the last
token's embedding (and document) from one call to the next in :class:`ShiftState`, inside the
:class:`LayerCaches` it returns, so a decoding step or a chunked prefill gives what a full pass does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class ShiftState:
    """What a token shift continues from: the last token's embedding ``e_{t-1}: (B, d_model)`` and
    its document ``(B,)`` (``None`` when the calls give no ``doc_ids``)."""

    embedding: Tensor
    doc_ids: Tensor | None


class LayerCaches(list):
    """One cache per layer, as :meth:`priorattn.models.GPT.forward` returns them, and ``shift``:
    the :class:`ShiftState` its next call continues from (``None`` for a model without token shift).

    A plain ``list`` otherwise: it may be indexed, iterated and passed back; like the caches in it,
    it never changes once made, so several continuations may branch from one.
    """

    def __init__(self, caches=(), shift: ShiftState | None = None):
        super().__init__(caches)
        self.shift = shift


class TokenShift(nn.Module):
    """``h_t = e_t + W e_{t-1}`` over token embeddings, with ``W = weight: (d_model, d_model)`` a
    bias-free linear map (``F.linear``)."""

    def __init__(self, d_model: int):
        super().__init__()
        # Zero: a new model is exactly the model without the shift, so the option changes only what
        # training learns and W e_{t-1} never starts as noise on top of e_t; the gradient
        # sum_t g_t e_{t-1}^T is not zero, so W learns. Made as zeros rather than an nn.Linear
        # zeroed after its random init, which would draw from the RNG: the same seed then gives
        # every other weight exactly as in the model without the shift (a paired comparison).
        self.weight = nn.Parameter(torch.zeros(d_model, d_model))

    def forward(
        self, e: Tensor, doc_ids: Tensor | None = None, state: ShiftState | None = None
    ) -> tuple[Tensor, ShiftState]:
        """``(h, state)`` for embeddings ``e: (B, L, d_model)`` (``L >= 1``).

        ``e_{t-1}`` is zero at the first token when ``state`` is ``None`` (a sequence's start) and
        wherever ``doc_ids[:, t] != doc_ids[:, t - 1]`` (a document starts); with ``state``, the first
        token's predecessor is ``state.embedding``, in another document if ``state.doc_ids`` differs.
        The returned state holds ``e``'s last token for the next call.
        """
        if state is not None and (state.doc_ids is None) != (doc_ids is None):
            held = (
                "no doc_ids but this call gives some"
                if state.doc_ids is None
                else "doc_ids but this call gives none"
            )
            raise ValueError(f"the token-shift state has {held}: pass doc_ids on every call or on none")
        if state is None:
            previous = F.pad(e[:, :-1], (0, 0, 1, 0))  # (B, L, d_model): e_{t-1}, zero at the start
        else:
            previous = torch.cat([state.embedding[:, None], e[:, :-1]], dim=1)  # (B, L, d_model)
        if doc_ids is not None:
            before = doc_ids[:, :1] if state is None else state.doc_ids[:, None]  # (B, 1)
            previous_doc_ids = torch.cat([before, doc_ids[:, :-1]], dim=1)  # (B, L)
            previous = previous.masked_fill((previous_doc_ids != doc_ids)[..., None], 0.0)
        # Copies, not views: a view would keep the whole chunk's embeddings alive in the caches.
        last_doc = None if doc_ids is None else doc_ids[:, -1].clone()
        return e + F.linear(previous, self.weight), ShiftState(e[:, -1].clone(), last_doc)
