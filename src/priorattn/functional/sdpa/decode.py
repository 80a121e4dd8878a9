"""The SDPA route's decode step, :func:`sdpa_bias_attention`: a few queries against a longer cache
take the prior's log-prior tile as an additive bias instead of folding lanes into every cached key.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...priors import Prior
from ...ssmax import Scaling
from ..grouped import grouped, grouped_scores, grouped_values
from ..masks import Masking
from ..prior_inputs import centred_key_bias, prior_factor
from ..reference import compute_dtype

#: A decode step has at most this many queries (see :func:`sdpa_bias_attention`).
DECODE_QUERIES = 16
#: Largest bias tile ``B * H * Lq * Lk`` a decode step builds (64 MB in float32).
BIAS_TILE_CELLS = 1 << 24


def is_decode_step(q: Tensor, k: Tensor) -> bool:
    """A few queries against a longer cache, whose bias tile is small: :func:`sdpa_bias_attention`'s case."""
    B, H, Lq = q.shape[:3]
    Lk = k.shape[2]
    return Lq <= DECODE_QUERIES and Lq < Lk and B * H * Lq * Lk <= BIAS_TILE_CELLS


def flash_takes(q: Tensor, k: Tensor, v: Tensor, bias: Tensor) -> bool:
    """Whether a decode step may run the CPU flash kernel with the tile as its mask: one width for
    q, k and v (a layer's KV cache keeps its keys padded to the values' width for this:
    ``KVCache.padded_keys``), one dtype, float32 or float64 (half precision computes in float32
    here), and no gradient asked of the tile (the kernel's backward gives none to its mask)."""
    same = q.shape[-1] == k.shape[-1] == v.shape[-1]
    plain = q.dtype == k.dtype == v.dtype == bias.dtype and q.dtype in (torch.float32, torch.float64)
    return same and plain and q.device.type == "cpu" and not (torch.is_grad_enabled() and bias.requires_grad)


def sdpa_bias_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    prior: Prior | None,
    masking: Masking,
    scale: float,
    ssmax: Scaling | None,
    key_bias: Tensor | None = None,
) -> Tensor:
    """A decode step: logits ``scale <q, k> + K`` with the prior's log-prior tile ``(B, H, Lq, Lk)``
    plus ``key_bias`` ``(B or 1, H or 1, Lk)`` centred on the keys
    (:func:`~..prior_inputs.centred_key_bias`); one of the two at least.

    With few queries the tile is smaller than the keys: folding would rebuild ``[k, k_lanes]`` (and
    pad ``v``) for every cached key at every step, an O(Lk D) copy as costly as the attention itself,
    while the tile is O(H Lk). Any prior fits, folding or not, and the tile is the reference's own
    ``log_prior``; on run positions (a generation's) ``log_prior_of_runs``, which priors with
    position tables answer with a view of them, so building the tile costs nothing per key.
    A row that sees no key (or only keys with a -inf log-prior) returns zeros, as on the reference
    route.

    Where :func:`flash_takes`, the CPU flash kernel takes the tile as its additive mask and reads k
    and v once, grouped query heads as extra queries of their key/value head (no copy of the
    cache). Otherwise (keys narrower than values, half precision, a tile that needs its gradient,
    other devices) the products are taken directly.
    """
    Lq, Lk = q.shape[2], k.shape[2]
    dtype = compute_dtype(q.dtype)
    bias = None if key_bias is None else centred_key_bias(key_bias, slice(None), dtype)[..., None, :]
    if prior is not None:
        if masking.starts is None:
            tile = prior.log_prior(masking.q_pos, masking.k_pos).to(dtype)  # (B or 1, H, Lq, Lk)
        else:  # positions are runs (a generation's): the prior's tables give views, no work per key
            tile = prior.log_prior_of_runs(masking.q_start, Lq, masking.k_start, Lk, q.device, dtype)
        bias = tile if bias is None else tile + bias
    # The usual step, one newest query under a plain causal mask, sees every key: nothing to hide.
    visible = None if masking.plain_causal and Lq == 1 else masking.visible()  # (B or 1, 1, Lq, Lk)
    factor = None
    if ssmax is not None:
        counts = torch.full((1, 1), Lk) if visible is None else visible.sum(-1)[:, 0]
        factor = ssmax.factor(counts.to(q.device)).to(dtype)  # (B or 1, H, Lq, 1)
    row_factor = prior_factor(q, prior, factor, ssmax is not None and ssmax.scale_prior)
    if row_factor is not None:
        bias = bias * row_factor.to(dtype)
    q = q.to(dtype) * scale
    if factor is not None:
        q = q * factor
    if flash_takes(q, k, v, bias):
        if visible is not None:  # the kernel returns zeros for a row of -inf (tested)
            bias = bias.masked_fill(~visible, -torch.inf)
        B, H, Hkv = *q.shape[:2], k.shape[1]
        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        mask = grouped(bias.expand(B, H, Lq, Lk), Hkv)
        out = flash(grouped(q, Hkv), k, v, 0.0, False, attn_mask=mask, scale=1.0)[0]
        return out.view(B, H, Lq, v.shape[-1])
    logits = grouped_scores(q, k.to(dtype)) + bias
    if visible is None:
        return grouped_values(torch.softmax(logits, dim=-1), v.to(dtype)).to(v.dtype)
    probs = torch.softmax(logits.masked_fill_(~visible, torch.finfo(dtype).min), dim=-1)
    probs = probs * visible  # as masked_softmax: a row with no visible or only -inf logits gets zeros
    return grouped_values(probs, v.to(dtype)).to(v.dtype)
