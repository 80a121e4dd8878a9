"""Grouped-query products without copying keys and values per query head.

Query head ``h`` reads key/value head ``h // G`` (``G = H / Hkv``, the ``repeat_interleave``
convention), so ``(B, H, L, D)`` queries are viewed as ``(B, Hkv, G * L, D)`` and multiplied against
the shared keys directly.
"""

from __future__ import annotations

from torch import Tensor


def grouped_scores(q: Tensor, k: Tensor) -> Tensor:
    """``q @ k^T`` per head: ``(B, H, Lq, D) x (B, Hkv, Lk, D) -> (B, H, Lq, Lk)``."""
    B, H, Lq, D = q.shape
    Hkv = k.shape[1]
    scores = q.reshape(B, Hkv, (H // Hkv) * Lq, D) @ k.transpose(-1, -2)
    return scores.view(B, H, Lq, k.shape[2])


def grouped_values(probs: Tensor, v: Tensor) -> Tensor:
    """``probs @ v`` per head: ``(B, H, Lq, Lk) x (B, Hkv, Lk, Dv) -> (B, H, Lq, Dv)``."""
    B, H, Lq, Lk = probs.shape
    Hkv = v.shape[1]
    out = probs.reshape(B, Hkv, (H // Hkv) * Lq, Lk) @ v
    return out.view(B, H, Lq, v.shape[-1])
