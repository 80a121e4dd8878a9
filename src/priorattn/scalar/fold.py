"""The scalar Gaussian term in bilinear form: extra q/k lanes for one SDPA call (seed 002).

Seed 002 "Training Complexity" leaves the exact form O(n^2); expanding the square makes it one more
folded term, as the core folds a prior (seed 000 Eq. 20-24):

    -(q_i - k_j)^2 / tau_i = -q_i^2 / tau_i  +  (2 q_i / tau_i) k_j  +  (-1 / tau_i) k_j^2

The first term depends on the query alone and cancels in the softmax over keys, the other two are
products of a query lane and a key lane: ``q lanes [2 q_i / tau_i, -1 / tau_i]``, ``k lanes
[k_j, k_j^2]``. ``tau`` belongs to the query (one per head, or one per query token), so it sits in
the query lanes and a data-dependent tau folds as well as a fixed one. (A per-key tau would fold
too, but with three lanes, and the window a query must read in a sorted cache would then depend on
every key's tau rather than on its own: seed 002 "Binary Search at Inference" bounds the window by
the query's bandwidth, so the bandwidth is the query's.)

Grouped value attention (seed 002 "Grouped Value Attention"): ``m = H / G`` heads share the keys and
values of group ``g``. Their scalar keys sit side by side in the group's key lanes, ``[k^(g,0),
k^(g,0)^2, ..., k^(g,m-1), k^(g,m-1)^2]`` (2m lanes), and head ``r`` of the group fills only its own
two query lanes, so one grouped-query SDPA call serves every head without copying values per head.
The SDPA kernel pads q, k and v to one width anyway, so these lanes are free while ``2m`` stays
within the value width.
"""

from __future__ import annotations

import torch
from torch import Tensor


def query_lanes(q_s: Tensor, tau: Tensor, groups: int) -> Tensor:
    """``(B, H, Lq, 2m)``: head ``r`` of its group holds ``[2 q_s / tau, -1 / tau]`` in lanes
    ``2r, 2r + 1`` and zeros elsewhere; ``tau`` broadcastable to ``(B, H, Lq)``."""
    B, H, Lq = q_s.shape
    m = H // groups
    tau = tau.expand(B, H, Lq)
    query = torch.stack([2 * q_s / tau, -1 / tau], dim=-1)  # (B, H, Lq, 2)
    own = torch.eye(m, dtype=q_s.dtype, device=q_s.device)[:, None, :, None]  # (m, 1, m, 1)
    return (query.view(B, groups, m, Lq, 1, 2) * own).reshape(B, H, Lq, 2 * m)


def key_lanes(k_s: Tensor, groups: int) -> Tensor:
    """``(B, G, Lk, 2m)``: the group's heads' ``[k_s, k_s^2]`` side by side; ``k_s (B, H, Lk)``."""
    B, H, Lk = k_s.shape
    m = H // groups
    key = torch.stack([k_s, k_s * k_s], dim=-1)  # (B, H, Lk, 2)
    return key.view(B, groups, m, Lk, 2).transpose(2, 3).reshape(B, groups, Lk, 2 * m)
