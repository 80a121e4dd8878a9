"""Grouped-query products without copying keys and values per query head.

Query head ``h`` reads key/value head ``h // G`` (``G = H / Hkv``, the ``repeat_interleave``
convention), so ``(B, H, L, D)`` queries are viewed as ``(B, Hkv, G * L, D)`` and multiplied against
the shared keys directly.
"""

from __future__ import annotations

from torch import Tensor


def grouped(x: Tensor, Hkv: int) -> Tensor:
    """``(B, H, L, X) -> (B, Hkv, G * L, X)``: query heads grouped by the key/value head they read."""
    B, H, L, X = x.shape
    return x.reshape(B, Hkv, (H // Hkv) * L, X)


def grouped_scores(q: Tensor, k: Tensor) -> Tensor:
    """``q @ k^T`` per head: ``(B, H, Lq, D) x (B, Hkv, Lk, D) -> (B, H, Lq, Lk)``."""
    B, H, Lq, _ = q.shape
    return (grouped(q, k.shape[1]) @ k.transpose(-1, -2)).view(B, H, Lq, k.shape[2])


def grouped_values(probs: Tensor, v: Tensor) -> Tensor:
    """``probs @ v`` per head: ``(B, H, Lq, Lk) x (B, Hkv, Lk, Dv) -> (B, H, Lq, Dv)``."""
    B, H, Lq, _ = probs.shape
    return (grouped(probs, v.shape[1]) @ v).view(B, H, Lq, v.shape[-1])
