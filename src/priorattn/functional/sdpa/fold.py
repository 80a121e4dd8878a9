"""The fold of a prior into SDPA's inputs (seed 000 Eq. 20-24): :class:`Fold` builds ``q'`` and ``k'``
of one call from q, k and the prior's lanes; the helpers give the flash kernel one head width and as
many key heads as query heads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ...priors import FoldLanes
from ..masks import Masking
from ..prior_inputs import (
    centred_key_bias,
    centred_keys,
    content_queries,
    query_lanes,
)


@dataclass(frozen=True)
class Fold:
    """What turns one call's q, k, v and lanes into SDPA's inputs of ``heads`` heads and ``width``
    lanes (seed 000 Eq. 20-24): ``q' = [scale * q, q_lanes, 1, m_h]``, ``k' = [k, k_lanes, u_h(j),
    k_pos[j] - centre]`` (the last two lanes for a key bias and a slope), ``v`` padded to ``width``.
    A query's prior lanes are multiplied by its row factor (SSMax's, a prior's query gate). The slope
    lane is centred on the call's queries; the key bias lane, where it holds the op's ``key_bias``, on
    the call's keys (:func:`~..prior_inputs.centred_key_bias`; a prior's own bounded key terms stay as
    they are, bit for bit as before)."""

    masking: Masking
    scale: float
    heads: int
    width: int
    centred_bias: bool = False  # the op's key bias is in the key bias lane: centre it per call

    def queries(
        self, q: Tensor, lanes: FoldLanes, factor: Tensor | None, row_factor: Tensor | None
    ) -> Tensor:
        """``q'`` of one call: ``q``, ``lanes.q``, the SSMax ``factor`` (of the content) and the prior's
        ``row_factor`` (of the lanes, :func:`~..prior_inputs.prior_factor`) hold its query rows."""
        content = content_queries(q, self.scale, factor)
        B, H, lq = q.shape[:3]
        q_lanes = [lanes.q.expand(B, H, lq, lanes.q.shape[-1])]
        if lanes.key_bias is not None:  # <1, u_h(j)>
            q_lanes.append(lanes.q.new_ones(1, 1, 1, 1).expand(B, H, lq, 1))
        if lanes.slope is not None:  # <m_h, k_pos[j] - centre>
            q_lanes.append(lanes.slope[:, None, None].to(lanes.q.dtype).expand(B, H, lq, 1))
        if len(q_lanes) == 1 and not lanes.q.shape[-1]:
            return content
        q_lanes = torch.cat(q_lanes, dim=-1)
        return torch.cat([content, query_lanes(q, q_lanes, row_factor)], dim=-1)

    def keys(self, k: Tensor, v: Tensor, lanes: FoldLanes, rows: slice, cols: slice) -> tuple[Tensor, Tensor]:
        """``k'`` and the padded ``v`` of query ``rows`` against key ``cols``: ``k``, ``v``, ``lanes.k``
        and ``lanes.key_bias`` hold those columns. A key bias is per head: the keys take every head."""
        if lanes.key_bias is not None and k.shape[1] != self.heads:
            group = self.heads // k.shape[1]
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        B, Hk, lk = k.shape[:3]
        k_lanes = [lanes.k.to(k.dtype).expand(B, Hk, lk, lanes.k.shape[-1])]
        if lanes.key_bias is not None:  # centred on these keys: a constant per query of the call
            key_bias = lanes.key_bias.to(k.dtype)
            if self.centred_bias:
                key_bias = centred_key_bias(lanes.key_bias, slice(None), k.dtype)
            k_lanes.append(key_bias[..., None].expand(B, Hk, lk, 1))
        if lanes.slope is not None:
            offset = centred_keys(self.masking, rows, cols, k.dtype)  # (B or 1, lk)
            k_lanes.append(offset[:, None, :, None].expand(B, Hk, lk, 1))
        if len(k_lanes) > 1 or lanes.k.shape[-1]:
            k = torch.cat([k, *k_lanes], dim=-1)
        return k, v if v.shape[-1] == self.width else F.pad(v, (0, self.width - v.shape[-1]))


def to_width(t: Tensor, width: int) -> Tensor:
    """``t`` with zero lanes up to ``width``: the flash kernel wants one head width for q, k, v."""
    return t if t.shape[-1] == width else F.pad(t, (0, width - t.shape[-1]))


def every_head(k: Tensor, heads: int) -> Tensor:
    """Grouped keys or values repeated to ``heads`` heads: the flash kernel wants as many as q."""
    return k if k.shape[1] == heads else k.repeat_interleave(heads // k.shape[1], 1)


def with_row_balance(lanes: FoldLanes, key_bias: Tensor, Lq: int) -> FoldLanes:
    """``lanes`` with one more lane that balances the gradient of the op's ``key_bias`` ``u``
    ``(B or 1, H or 1, Lk)`` row by row: ``q`` holds ``u[t_i] - u[t_i]`` (zero, with ``u[t_i]``'s
    gradient) and ``k`` holds -1, so row i's logits gain ``-(u[t_i] - u[t_i]) = 0`` and ``u[t_i]``
    the gradient ``-sum_j dS_ij``, ``t_i = i + Lk - Lq`` (clamped to the keys) query i's own key
    when queries are the newest keys, ``dS`` the gradient of the logits.

    A per-row constant leaves the softmax as it was, so ``sum_j dS_ij`` is zero in exact arithmetic,
    but the flash kernel's rows of ``dS`` sum to its rounding. The key bias's gradient
    ``sum_i dS_ij`` carries those sums, which sum to zero over no run of keys, and a reverse
    cumulative sum (FoX's gate: ``F`` back to ``log f``, Lin et al. 2025 Sec. 2) adds up every later
    row's. With the lane, ``log f_l``'s gradient is ``sum_{j < l <= i} dS_ij``, the paper's
    ``D_ij = F_i - F_j`` differentiated: every term is a pair whose logit holds ``log f_l``, and the
    kernel's row sums cancel by construction."""
    Lk = key_bias.shape[-1]
    own = (torch.arange(Lq, device=key_bias.device) + (Lk - Lq)).clamp(0, Lk - 1)
    at_own = key_bias[..., own]  # (B or 1, H or 1, Lq)
    balance = (at_own - at_own.detach())[..., None].to(lanes.q.dtype)
    # Of empty views, not torch.broadcast_shapes: its first call imports 35 MB of symbolic shapes.
    shape = torch.broadcast_tensors(lanes.q[..., :0], balance[..., :0])[0].shape[:-1]
    q_lanes = torch.cat([lanes.q.expand(*shape, lanes.q.shape[-1]), balance.expand(*shape, 1)], dim=-1)
    k_lanes = torch.cat([lanes.k, lanes.k.new_full((*lanes.k.shape[:-1], 1), -1.0)], dim=-1)
    return lanes._replace(q=q_lanes, k=k_lanes)


def lanes_of(lanes: FoldLanes, rows: slice, cols: slice) -> FoldLanes:
    """The lanes of query ``rows`` and key ``cols`` (views)."""
    key_bias = None if lanes.key_bias is None else lanes.key_bias[..., cols]
    return FoldLanes(lanes.q[..., rows, :], lanes.k[..., cols, :], key_bias, lanes.slope)
