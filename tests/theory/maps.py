"""Attention weights as the library's op computes them, and priors with exact float64 parameters,
for the theorem tests.

With the identity as values, the output row of query i is its weight row; with one indicator column
as values, the output is the total weight on the marked keys (rows too long for an ``Lk x Lk`` eye).
"""

from __future__ import annotations

import torch
from torch import Tensor

import priorattn
from priorattn.priors import ALiBi


def attention_weights(q: Tensor, k: Tensor, **kwargs) -> Tensor:
    """``(B, H, Lq, Lk)``: the weights of ``priorattn.attention(q, k, v, **kwargs)``."""
    B, Hkv, Lk, _ = k.shape
    eye = torch.eye(Lk, dtype=q.dtype).expand(B, Hkv, Lk, Lk)
    return priorattn.attention(q, k, eye, **kwargs)


def weight_on(q: Tensor, k: Tensor, keys: Tensor, **kwargs) -> Tensor:
    """``(B, H, Lq)``: the total weight on the keys where ``keys`` ``(Lk,)`` is True."""
    B, Hkv, Lk, _ = k.shape
    indicator = keys.to(q.dtype)[:, None].expand(B, Hkv, Lk, 1)
    return priorattn.attention(q, k, indicator, **kwargs)[..., 0]


def causal_visible(L: int) -> Tensor:
    """``(L, L)`` bool: key j is visible to query i iff ``j <= i`` (the op's default positions)."""
    return torch.ones(L, L, dtype=torch.bool).tril()


def alibi(slope: float) -> ALiBi:
    """One ALiBi head with this exact float64 slope (the constructor stores slopes in the default dtype)."""
    prior = ALiBi(1).double()
    prior.slopes.fill_(slope)
    return prior
