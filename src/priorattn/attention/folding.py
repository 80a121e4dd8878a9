"""Turning a prior's :class:`~priorattn.priors.FoldLanes` into q/k inputs (seed 000 Eq. 20-24).

With ``q' = [scale * q, q_lanes]`` and ``k' = [k, k_lanes]``, ``<q', k'> = scale <q, k> + <lanes>``:
the log-prior enters unscaled and no ``Lq x Lk`` bias exists. Key-only terms (sink, slope) are one
more lane ``<1, u_h(j) + m_h (k_pos[j] - centre)>`` in SDPA, or a broadcast row in the blockwise
route. SSMax multiplies row i of ``q'`` by ``s_h log n_i`` (the lanes too when it scales the prior).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..priors import FoldLanes
from .masks import Masking

#: Largest magnitude the centred slope term may reach within one call, per dtype: past it, rounding
#: of ``m * (k_pos - centre)`` shows in the logits (tests/attention/test_routes.py measures it).
SLOPE_MAGNITUDE = {
    torch.float64: 2.0**30,
    torch.float32: 2.0**8,
    torch.bfloat16: 2.0**0,
    torch.float16: 2.0**2,
}


def slope_span(lanes: FoldLanes, dtype: torch.dtype) -> int | None:
    """Longest run of queries one call may cover with the slope centred on them; None: no limit."""
    if lanes.slope is None:
        return None
    largest = float(lanes.slope.detach().abs().max()) if lanes.slope.numel() else 0.0
    if largest == 0.0:
        return None
    return max(1, int(SLOPE_MAGNITUDE.get(dtype, SLOPE_MAGNITUDE[torch.float32]) / largest))


def lane_inputs(
    q: Tensor,
    k: Tensor,
    lanes: FoldLanes,
    rows: slice,
    cols: slice,
    scale: float,
    factor: Tensor | None,
    scale_prior: bool,
) -> tuple[Tensor, Tensor]:
    """``[scale * q, q_lanes]`` and ``[k, k_lanes]`` for query ``rows`` and key ``cols``.

    ``q`` and ``k`` arrive sliced; the result has the dtype of ``q``.
    """
    B, H, lq = q.shape[:3]
    content = q * scale if factor is None else q * scale * factor
    q_lanes = lanes.q[..., rows, :]
    if factor is not None and scale_prior:
        q_lanes = q_lanes * factor
    q_lanes = q_lanes.to(q.dtype).expand(B, H, lq, q_lanes.shape[-1])
    k_lanes = lanes.k[..., cols, :].to(k.dtype)
    k_lanes = k_lanes.expand(B, k.shape[1], *k_lanes.shape[-2:])
    return torch.cat([content.to(q.dtype), q_lanes], dim=-1), torch.cat([k, k_lanes], dim=-1)


def centred_keys(masking: Masking, rows: slice, cols: slice, dtype: torch.dtype) -> Tensor:
    """``k_pos[j] - centre`` ``(B or 1, lk)``, centred on the last query of ``rows``: the slope lane."""
    centre = masking.q_pos[:, rows].amax(dim=-1, keepdim=True)
    return (masking.k_pos[:, cols] - centre).to(dtype)


def key_terms(lanes: FoldLanes, masking: Masking, rows: slice, cols: slice) -> Tensor | None:
    """``u_h(j) + m_h (k_pos[j] - centre)``, ``(B or 1, H, lk)``: the key-only part of the prior."""
    terms = None if lanes.key_bias is None else lanes.key_bias[..., cols]
    if lanes.slope is not None:
        offset = centred_keys(masking, rows, cols, lanes.slope.dtype)
        slope_term = lanes.slope[:, None] * offset[:, None, :]
        terms = slope_term if terms is None else terms + slope_term
    return terms
