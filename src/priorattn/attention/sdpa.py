"""The SDPA route: fold the prior into extra q/k lanes and call one unmodified SDPA.

Seed 000 Eq. 20-24 / Algorithm 1: with ``q' = [scale * q, q_lanes]`` and ``k' = [k, k_lanes]``,
``<q', k'> = scale <q, k> + K(i, j) + c_i`` and SDPA runs with its own scale set to 1, so the
log-prior enters unscaled and no ``Lq x Lk`` bias is ever built. SSMax multiplies row i of ``q'``
by ``s_h log n_i``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..priors import Prior
from ..ssmax import Scaling
from .masks import Masking

#: Largest number of (query, key) cells of a boolean mask handed to SDPA in one call.
MASK_CHUNK_CELLS = 1 << 22


def fold_qk(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    prior: Prior | None,
    masking: Masking,
    rows: slice,
    cols: slice,
    scale: float,
    factor: Tensor | None,
    scale_prior: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """``q'``, ``k'``, ``v'`` whose plain inner product is the (SSMax-scaled) prior logit.

    ``q`` holds query ``rows`` and ``k``, ``v`` key ``cols`` already. Key lanes that differ per query
    head (GOAT's sink) expand grouped keys and values to one head per query head.
    """
    B, H = q.shape[:2]
    content = q * scale if factor is None else (q * scale * factor).to(q.dtype)
    if prior is None:
        return content, k, v
    lanes = prior.fold(masking.q_pos[:, rows], masking.k_pos[:, cols])
    q_lanes = lanes.q if factor is None or not scale_prior else lanes.q * factor
    Hk = lanes.k.shape[-3]
    if Hk != 1 and Hk != k.shape[1]:
        k = k.repeat_interleave(Hk // k.shape[1], dim=1)
        v = v.repeat_interleave(Hk // v.shape[1], dim=1)
    q_lanes = q_lanes.to(q.dtype).expand(B, H, *q_lanes.shape[-2:])
    k_lanes = lanes.k.to(k.dtype).expand(B, k.shape[1], *lanes.k.shape[-2:])
    return torch.cat([content, q_lanes], dim=-1), torch.cat([k, k_lanes], dim=-1), v


def query_chunks(masking: Masking, prior: Prior | None, dtype: torch.dtype) -> list[slice]:
    """Runs of queries for one SDPA call each.

    A chunk is capped by the prior's :meth:`~Prior.fold_span` (precision of key-linear lanes) and,
    when a boolean mask is needed, by :data:`MASK_CHUNK_CELLS`.
    """
    Lq, Lk = masking.q_pos.shape[-1], masking.k_pos.shape[-1]
    step = Lq
    if prior is not None and prior.fold_span(dtype) is not None:
        step = min(step, prior.fold_span(dtype))
    if masking.masks_anything and not (masking.plain_causal and Lq == Lk and step == Lq):
        step = min(step, max(1, MASK_CHUNK_CELLS // max(Lk, 1)))
    return [slice(s, min(s + step, Lq)) for s in range(0, Lq, step)]


def visible_columns(masking: Masking, rows: slice) -> slice:
    """Keys a run of queries can possibly see: under plain causal masking, none past the last query."""
    if not masking.plain_causal:
        return slice(None)
    Lq, Lk = masking.q_pos.shape[-1], masking.k_pos.shape[-1]
    return slice(0, Lk - Lq + rows.stop)


def sdpa_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    prior: Prior | None,
    masking: Masking,
    scale: float,
    ssmax: Scaling | None,
) -> Tensor:
    """Prior attention through ``torch.nn.functional.scaled_dot_product_attention``."""
    if prior is not None and not prior.can_fold(masking.causal):
        raise ValueError(
            f"backend='sdpa' needs a prior that folds into q/k lanes; {type(prior).__name__} does not"
            f"{' without a causal mask' if not masking.causal else ''}: use backend='memeff'"
        )
    Lq, Lk = q.shape[2], k.shape[2]
    counts = masking.visible_keys() if ssmax is not None else None
    outputs = []
    for rows in query_chunks(masking, prior, q.dtype):
        cols = visible_columns(masking, rows)
        factor = None if counts is None else ssmax.factor(counts[:, rows])
        q2, k2, v2 = fold_qk(
            q[:, :, rows],
            k[:, :, cols],
            v[:, :, cols],
            prior,
            masking,
            rows,
            cols,
            scale,
            factor,
            ssmax is not None and ssmax.scale_prior,
        )
        is_causal = masking.plain_causal and Lq == Lk and rows == slice(0, Lq)
        mask = None
        if masking.masks_anything and not is_causal:
            mask = masking.visible(rows, cols)
            if bool(mask.all()):
                mask = None
        out = F.scaled_dot_product_attention(
            q2,
            k2,
            v2,
            attn_mask=mask,
            is_causal=is_causal,
            scale=1.0,
            enable_gqa=q2.shape[1] != k2.shape[1],
        )
        if mask is not None:
            out = torch.where(mask.any(dim=-1, keepdim=True), out, 0.0)
        outputs.append(out)
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)
