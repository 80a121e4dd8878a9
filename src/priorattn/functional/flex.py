"""The FlexAttention route: forward and backward on CUDA, forward only on the CPU (no CPU backward).

A folding prior enters through its q/k lanes (seed 000 Eq. 20-24); its key-only terms and slope are
added by ``score_mod`` at each (query, key) pair, the slope in its exact lag form ``-m_h (i - j)``.
A relative prior on position runs is read from its lag table (one value per lag). The masks become
a FlexAttention block mask, so fully hidden blocks are skipped. The first call for a shape compiles
(about 20 s on 2 CPU cores); later calls reuse it.

On CUDA ``backend="auto"`` takes this route for a prior that does not fold (there its backward
exists, and the blockwise ``memeff`` route is a loop of small kernels). Only the choice is
tested without a GPU; the CUDA runs of the route tests skip here.
"""

from __future__ import annotations

from functools import cache, lru_cache

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from ..priors import Prior
from ..priors.score_mod import RowCentre, at, score_mod_of
from ..ssmax import Scaling
from .masks import Masking
from .prior_inputs import prior_factor, split_prior
from .reference import compute_dtype


def flex_trains_on(device: torch.device) -> bool:
    """Whether FlexAttention has a backward on ``device``: on CUDA, not on the CPU."""
    return device.type == "cuda"


#: FlexAttention's kernels take head widths of at least 16 (inductor: "NYI" below it, torch 2.11
#: on CUDA); narrower q/k (a small head plus fold lanes) and v are padded with zero lanes, which add
#: nothing to a score or an output.
MIN_HEAD_DIM = 16


def pad_width(x: Tensor, width: int) -> Tensor:
    return x if x.shape[-1] >= width else torch.nn.functional.pad(x, (0, width - x.shape[-1]))


def slope_gradient_as_key_bias(slope: Tensor, k_pos: Tensor, key_bias: Tensor | None):
    """``(slope without its gradient, key bias that carries it)``, equal in value to ``(slope,
    key_bias)``.

    Under the softmax over keys ``-m (i - j) = -m i + m j``, and ``-m i`` is one constant per query
    row, whose gradient sums to zero along the row; so a loss's gradient with respect to ``m`` is
    exactly that of the key term ``m j``. FlexAttention computes the gradient of a tensor that
    ``score_mod`` reads by atomic adds from every (query, key) pair into it: into ``H`` slopes they
    serialize (GOAT with a learned slope ran hundreds of times flash SDPA, docs/benchmarks.md), into
    ``B x H x Lk`` key biases they spread. The added term is ``m j - m j``: zero in value, ``j`` in
    gradient."""
    if not slope.requires_grad:
        return slope, key_bias
    term = slope[None, :, None] * k_pos[:, None, :].to(slope.dtype)  # (B, H, Lk)
    zero = term - term.detach()
    return slope.detach(), zero if key_bias is None else key_bias + zero


def row_centred_key_bias(key_bias: Tensor, Lq: int, dtype: torch.dtype) -> tuple[Tensor, RowCentre]:
    """The op's ``key_bias`` ``(B, H, Lk)`` rounded to ``dtype`` (``hi``, with its gradient) and the
    :class:`~priorattn.priors.score_mod.RowCentre` ``score_mod`` subtracts from it per query row:
    ``hi`` at key ``t = i + Lk - Lq`` (clamped to the keys: query ``i``'s own place when queries are
    the newest keys), and what the rounding dropped (a float64 bias: FoX's ``-F_j``; None when
    nothing was dropped).

    A constant per query row leaves its softmax as it was, and for a bias that grows with ``j`` the
    row's own key holds the largest value the row sees. Two nearby keys' ``hi`` differ exactly
    (Sterbenz's lemma), so a bias drifted to 1e4 keeps float32's precision at each row's near keys
    without reading a value (the ``sdpa`` route centres runs of queries sized by the drift it reads)
    and in one kernel call. Only ``hi`` at the keys carries the gradient: a row constant's is zero,
    and the dropped part is a rounding error."""
    hi = key_bias.to(dtype)
    Lk = key_bias.shape[-1]
    own = (torch.arange(Lq, device=key_bias.device) + (Lk - Lq)).clamp(0, Lk - 1)
    if key_bias.dtype == dtype:
        return hi, RowCentre(hi.detach()[..., own])
    rounding = (key_bias.detach() - hi.detach().to(key_bias.dtype)).to(dtype)
    return hi, RowCentre(hi.detach()[..., own], rounding, rounding[..., own])


@cache
def compiled_flex():
    return torch.compile(flex_attention, dynamic=False)


@cache
def compiled_block_mask():
    return torch.compile(create_block_mask, dynamic=False)


def mask_mod_of(masking: Masking):
    """FlexAttention's ``mask_mod(b, h, q_idx, kv_idx)`` for ``masking``: whether query ``q_idx`` of
    row ``b`` sees key ``kv_idx``, on their positions (positions shared by the batch serve every row)."""

    def mask_mod(b, h, q_idx, kv_idx):
        lag = at(masking.q_pos, b, q_idx) - at(masking.k_pos, b, kv_idx)
        keep = lag >= 0 if masking.causal else lag == lag
        if masking.window is not None:
            keep = keep & ((lag if masking.causal else lag.abs()) < masking.window)
        if masking.q_doc is not None:
            keep = keep & (masking.q_doc[b, q_idx] == masking.k_doc[b, kv_idx])
        if masking.key_padding is not None:
            keep = keep & ~masking.key_padding[b, kv_idx]
        return keep

    return mask_mod


def block_mask(masking: Masking, B: int):
    """FlexAttention block mask for ``masking`` (None when nothing is masked). The plain causal mask
    (training, prefill) is made from indices alone and kept per shape: making a block mask evaluates
    ``mask_mod`` at every (query, key) pair, which at long lengths costs more than the attention."""
    if not masking.masks_anything:
        return None
    Lq, Lk = masking.q_pos.shape[-1], masking.k_pos.shape[-1]
    if masking.plain_causal:  # dynamo does not trace into an lru_cache: a compiled graph makes its own
        make = lower_right_causal.__wrapped__ if torch.compiler.is_compiling() else lower_right_causal
        return make(Lq, Lk, str(masking.q_pos.device))
    # Eagerly, create_block_mask evaluates mask_mod pair by pair through vmap; compiled it is one
    # kernel (attention-gym's advice). On the CPU, where flex runs forward only, each shape's
    # compilation would cost more than the masks it makes.
    device = masking.q_pos.device
    make = (
        compiled_block_mask()
        if flex_trains_on(device) and not torch.compiler.is_compiling()
        else create_block_mask
    )
    return make(mask_mod_of(masking), B, None, Lq, Lk, device=str(device))


@lru_cache(maxsize=16)
def lower_right_causal(Lq: int, Lk: int, device: str):
    """Key ``j`` visible to query ``i`` when ``j <= i + Lk - Lq``: the queries are the newest keys."""
    shift = Lk - Lq

    def causal(b, h, q_idx, kv_idx):
        return q_idx + shift >= kv_idx

    return create_block_mask(causal, None, None, Lq, Lk, device=device)


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
    ``(B or 1, H or 1, Lk)`` joins the key-only terms of ``score_mod``, centred per query row
    (:func:`row_centred_key_bias`: a key bias drifting by thousands keeps float32's precision)."""
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
    row_factor = prior_factor(q, prior, factor, ssmax is not None and ssmax.scale_prior)
    row_factor = None if row_factor is None else row_factor.to(dtype).expand(B, H, Lq, 1)
    q_pos, k_pos = masking.q_pos.expand(B, Lq), masking.k_pos.expand(B, -1)
    centre = key_bias is not None  # split_prior sums it into the prior's own key terms
    inputs = split_prior(q.to(dtype), k.to(dtype), prior, masking, scale, factor, row_factor, key_bias)
    if inputs.dense is not None:
        raise ValueError(
            f"backend='flex' needs a prior that folds or a relative prior on contiguous "
            f"positions; {type(prior).__name__} here is neither: use backend='memeff'"
        )
    # The op's key bias drifts: the key terms are centred per row where they hold it (a prior's own
    # key terms, GOAT's sink, stay small and go as they are).
    key_bias, slope, rows = inputs.key_bias, inputs.slope, None
    if centre:
        key_bias, rows = row_centred_key_bias(key_bias, Lq, dtype)
    # Tensors score_mod reads are made whole (no stride-0 views of a broadcast): inductor lowers
    # their gradients by scattering into each one.
    if slope is not None:
        slope, key_bias = slope_gradient_as_key_bias(slope.contiguous(), k_pos, key_bias)
    key_bias = None if key_bias is None else key_bias.expand(B, H, -1).contiguous()
    if rows is not None:
        rows = RowCentre(*(None if t is None else t.expand(B, H, -1).contiguous() for t in rows))
    table = None if inputs.table is None else inputs.table.expand(H, -1).contiguous()
    # the lag table's column 0 holds the lag of the last key and the first query (prior_inputs.lag_table)
    low = 0 if table is None else masking.starts[0] - masking.starts[1] - (k.shape[2] - 1)
    score_mod = score_mod_of(
        q_pos.contiguous(),
        k_pos.contiguous(),
        key_bias=key_bias,
        row_centre=rows,
        slope=slope,
        table=table,
        low=low,
        row_factor=row_factor,
    )
    mask = block_mask(masking, B)
    # Inside a compiled graph flex_attention is compiled with it; called eagerly, it needs its own.
    attend = flex_attention if torch.compiler.is_compiling() else compiled_flex()
    # On CUDA half-precision q, k, v go to the kernel as they are (it computes scores and the softmax
    # in float32); the prior's terms above stay in float32.
    kernel = q.dtype if flex_trains_on(q.device) else dtype
    width = max(MIN_HEAD_DIM, inputs.q.shape[-1])
    out = attend(
        pad_width(inputs.q.to(kernel), width),
        pad_width(inputs.k.to(kernel), width),
        pad_width(v.to(kernel), MIN_HEAD_DIM),
        score_mod=score_mod,
        block_mask=mask,
        scale=1.0,
        enable_gqa=H != k.shape[1],
    )[..., : v.shape[-1]]
    if masking.masks_anything and not masking.plain_causal:
        out = torch.where(masking.visible_keys()[:, None, :, None] > 0, out, 0.0)
    return out.to(v.dtype)
