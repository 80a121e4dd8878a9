"""FoX's forget gate (Lin et al., ICLR 2025), the key-bias part a
:class:`~priorattn.layers.PriorMultiheadAttention` takes: a data-dependent per-key decay whose
state the KV cache keeps."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .kv_cache import KVCache


class ForgetGate(nn.Module):
    """FoX's forget gate (Lin et al., "Forgetting Transformer: Softmax Attention with a Forget Gate",
    ICLR 2025, Sec. 2): ``f_t = sigmoid(w_f . x_t + b_f)`` per head, and the logits of query i and key
    j gain ``D_ij = sum_{l=j+1..i} log f_l = F_i - F_j`` with ``F`` the cumulative sum of ``log f``.

    Under the softmax over keys ``F_i`` is a per-query constant and cancels: what remains is the
    per-key term ``-F_j`` (:meth:`key_bias`), which the layer hands to :func:`priorattn.attention` as
    ``key_bias`` (one fold lane on the ``sdpa`` route, re-centred per run of queries). The layer
    takes the gate as an injected part and its KV cache keeps each key's ``F_j`` as the part's
    state (:meth:`key_state`), so cached decoding equals a full pass. ``F`` is summed in float64:
    it falls without bound (``log f < 0``), about ``1e4`` below zero after 16k tokens that forget
    strongly, where float32 would keep only ~1e-3 of it. In a packed row ``F`` restarts at each
    document's first token (so a row equals its documents run alone). The projection keeps
    PyTorch's default initialisation (the GPT's initialisation is for q, k, v and out).
    """

    def __init__(self, d_model: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.proj = nn.Linear(d_model, num_heads)  # w_f, b_f of every head

    def log_forget(self, x: Tensor) -> Tensor:
        """``log f_t`` ``(B, H, L)`` float64 of ``x: (B, L, d_model)``."""
        gate = self.proj(x)  # (B, L, H)
        return F.logsigmoid(gate.to(torch.promote_types(gate.dtype, torch.float32))).transpose(1, 2).double()

    def cumulative(self, x: Tensor, starts: Tensor | None, previous: Tensor | None) -> Tensor:
        """``F`` ``(B, H, L)`` float64 of the tokens ``x``: ``previous`` ``(B, H)`` (the running ``F``
        of a cache, None: 0) plus the running sum of ``log f``, restarting from 0 before each token
        where ``starts`` ``(B, L)`` is True (a document's first token)."""
        log_f = self.log_forget(x)
        total = log_f.cumsum(-1)  # (B, H, L)
        if previous is not None:
            total = total + previous[..., None]
        if starts is None:
            return total
        L = log_f.shape[-1]
        index = torch.arange(L, device=x.device)
        latest = torch.where(starts, index, -1).cummax(-1).values  # (B, L): latest start, -1: none yet
        before = (total - log_f).gather(-1, latest.clamp(min=0)[:, None].expand_as(total))  # F before it
        return total - torch.where(latest[:, None] >= 0, before, 0.0)

    def key_state(self, x: Tensor, doc_ids: Tensor | None, cache: KVCache | None) -> Tensor:
        """``F`` ``(B, H, L)`` float64 of the new tokens ``x: (B, L, d_model)``, continuing the running
        ``F`` of ``cache`` (the ``F_j`` it keeps as :attr:`KVCache.key_state`) and restarting at each
        document's first token where ``doc_ids`` ``(B, L)`` are given."""
        cached_ids = None if cache is None else cache.doc_ids
        starts = None if doc_ids is None else document_starts(doc_ids, cached_ids)
        previous = None
        if cache is not None and cache.key_state is not None and len(cache):
            previous = cache.key_state[..., -1]
        return self.cumulative(x, starts, previous)

    @staticmethod
    def key_bias(state: Tensor) -> Tensor:
        """The logits' per-key term ``-F_j`` of the keys' state ``F_j``: ``D_ij = F_i - F_j`` less the
        per-query ``F_i``, which the softmax cancels."""
        return -state

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}"


def document_starts(doc_ids: Tensor, cached: Tensor | None) -> Tensor:
    """``(B, L)`` bool: whether each new token begins a document, given the cached tokens' ids
    (``cached`` ``(B, Lc)``; None or empty: the first new token begins one)."""
    previous = doc_ids[:, :1] + 1 if cached is None or not cached.shape[1] else cached[:, -1:]
    return doc_ids != torch.cat([previous, doc_ids[:, :-1]], dim=1)
