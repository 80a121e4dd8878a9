"""The FlexAttention route: forward and backward on CUDA, forward only on the CPU (no CPU backward).

A folding prior enters through its q/k lanes (seed 000 Eq. 20-24); its key-only terms and slope are
added by ``score_mod`` at each (query, key) pair, the slope in its exact lag form ``-m_h (i - j)``.
A relative prior on position runs is read from its lag table (one value per lag). The masks become
a FlexAttention block mask, so fully hidden blocks are skipped. The first call for a shape compiles
(about 20 s on 2 CPU cores); later calls reuse it.

On CUDA ``backend="auto"`` takes this route for a prior that does not fold (issue 13: there its
backward exists, and the blockwise ``memeff`` route is a loop of small kernels). Only the choice is
tested without a GPU; the CUDA runs of the route tests skip here.
"""

from __future__ import annotations

from functools import cache

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from ..priors import Prior
from ..ssmax import Scaling
from .masks import Masking
from .prior_inputs import centred_key_bias, split_prior
from .reference import compute_dtype


def flex_trains_on(device: torch.device) -> bool:
    """Whether FlexAttention has a backward on ``device``: on CUDA, not on the CPU."""
    return device.type == "cuda"


@cache
def compiled_flex():
    return torch.compile(flex_attention, dynamic=False)


def block_mask(masking: Masking, B: int):
    """FlexAttention block mask for ``masking`` (None when nothing is masked)."""
    if not masking.masks_anything:
        return None
    Lq, Lk = masking.q_pos.shape[-1], masking.k_pos.shape[-1]
    q_pos, k_pos = masking.q_pos.expand(B, Lq), masking.k_pos.expand(B, Lk)

    def mask_mod(b, h, q_idx, kv_idx):
        lag = q_pos[b, q_idx] - k_pos[b, kv_idx]
        keep = lag >= 0 if masking.causal else lag == lag
        if masking.window is not None:
            keep = keep & ((lag if masking.causal else lag.abs()) < masking.window)
        if masking.q_doc is not None:
            keep = keep & (masking.q_doc[b, q_idx] == masking.k_doc[b, kv_idx])
        if masking.key_padding is not None:
            keep = keep & ~masking.key_padding[b, kv_idx]
        return keep

    return create_block_mask(mask_mod, B, None, Lq, Lk, device=str(q_pos.device))


def flex_route(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    prior: Prior | None,
    masking: Masking,
    scale: float,
    ssmax: Scaling | None,
    key_bias: Tensor | None = None,
) -> Tensor:
    """Prior attention through compiled FlexAttention (inference only off CUDA); ``key_bias``
    ``(B or 1, H or 1, Lk)`` joins the key-only terms of ``score_mod``, centred once on all keys (one
    call: a key bias drifting by hundreds keeps float32's precision on ``sdpa`` and ``memeff`` only)."""
    learnable = [q, k, v, *(prior.parameters() if prior is not None else ())]
    learnable += [ssmax.s] if ssmax is not None else []
    learnable += [key_bias] if key_bias is not None else []
    if not flex_trains_on(q.device) and torch.is_grad_enabled() and any(t.requires_grad for t in learnable):
        raise RuntimeError(
            "backend='flex' runs forward only: FlexAttention has no backward on the CPU. "
            "Use backend='memeff' or 'sdpa' for training, or call under torch.no_grad()"
        )
    B, H, Lq, _ = q.shape
    dtype = compute_dtype(q.dtype)
    factor = None if ssmax is None else ssmax.factor(masking.visible_keys()).to(dtype).expand(B, H, Lq, 1)
    scale_prior = ssmax is not None and ssmax.scale_prior
    q_pos, k_pos = masking.q_pos.expand(B, Lq), masking.k_pos.expand(B, -1)
    inputs = split_prior(q.to(dtype), k.to(dtype), prior, masking, scale, factor, scale_prior, key_bias)
    if inputs.dense is not None:
        raise ValueError(
            f"backend='flex' needs a prior that folds or a relative prior on contiguous "
            f"positions; {type(prior).__name__} here is neither: use backend='memeff'"
        )
    if inputs.key_bias is not None:  # the op's key bias drifts: centred; a prior's own key terms as they are
        centre = key_bias is not None
        key_bias = centred_key_bias(inputs.key_bias, slice(None), dtype) if centre else inputs.key_bias
        key_bias = key_bias.expand(B, H, -1)
    slope = inputs.slope
    table = None if inputs.table is None else inputs.table.expand(H, -1)
    offset = k.shape[2] - 1  # the lag table holds lag (q0 + i) - (k0 + j) at index i - j + Lk - 1

    def score_mod(score, b, h, q_idx, kv_idx):
        bias = 0.0
        if key_bias is not None:  # GOAT's sink u_h(j) (Eq. 19) and the op's key bias
            bias = bias + key_bias[b, h, kv_idx]
        if slope is not None:  # -m_h (i - j): the ALiBi lag form, exact at any position
            bias = bias - slope[h] * (q_pos[b, q_idx] - k_pos[b, kv_idx]).to(score.dtype)
        if table is not None:
            bias = bias + table[h, q_idx - kv_idx + offset]
        if factor is not None and scale_prior:
            bias = bias * factor[b, h, q_idx, 0]
        return score + bias

    mask = block_mask(masking, B)
    # Inside a compiled graph flex_attention is compiled with it; called eagerly, it needs its own.
    attend = flex_attention if torch.compiler.is_compiling() else compiled_flex()
    out = attend(
        inputs.q,
        inputs.k,
        v.to(dtype),
        score_mod=score_mod,
        block_mask=mask,
        scale=1.0,
        enable_gqa=H != k.shape[1],
    )
    if masking.masks_anything and not masking.plain_causal:
        out = torch.where(masking.visible_keys()[:, None, :, None] > 0, out, 0.0)
    return out.to(v.dtype)
