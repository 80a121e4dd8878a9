"""The Triton route: one fused kernel for the forward pass and two for the backward (after a small
one for the rows' ``rowsum(dO o)``), with the prior's terms and the content scale computed inside
them and its gradients reduced in registers (``triton_forward.py``, ``triton_backward.py``,
launched by the operator of ``triton_op.py``).

It takes every prior that folds (ALiBi, GOAT with or without its slope, Sandwich), every relative
prior on position runs (GGD, T5, KERPLE: a lag table) and, causal on positions from 0 on, FIRE (its
MLP interpolated on a grid of its normalised lag), with the op's key bias (FoX's ``-F_j``), SSMax
and a prior's query gate, under causal order, documents, key padding and a sliding window, with
grouped-query attention. Positions must be runs (the defaults, or any ``start + arange``), where the
lag is ``q0 - k0 + i - j``; other positions and other priors are refused with the route to use.

The kernels are one operator with its backward (``priorattn::fused_attention``), so a model that
takes this route compiles as one graph (``torch.compile(fullgraph=True)``): inductor fuses the
preparation around it and leaves the kernels as they are.

Triton runs on CUDA; on the CPU only under ``TRITON_INTERPRET=1`` (Triton's interpreter, which the
tests use to compare the kernels with the float64 reference).
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from ..priors import Prior
from ..ssmax import Scaling
from .masks import Masking
from .prior_inputs import (
    content_queries,
    fold_at,
    interpolates,
    lag_table,
    prior_factor,
    query_lanes,
    scaled_lag,
    tabulates,
    with_key_bias,
)
from .reference import compute_dtype
from .triton_op import Blocks, fused


def triton_available(device: torch.device) -> bool:
    """Whether the ``triton`` route runs on ``device``: Triton installed, and the device CUDA, or the
    CPU under ``TRITON_INTERPRET=1``."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return device.type == "cuda" or (device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1")


def triton_preferred(device: torch.device) -> bool:
    """Whether ``backend="auto"`` takes the ``triton`` route where it computes the call: on CUDA with
    Triton installed, eager or compiled (the kernels are one operator, :func:`fused_attention`, that
    ``torch.compile`` keeps whole in its graph, forward and backward)."""
    return device.type == "cuda" and triton_available(device)


def triton_takes(prior: Prior | None, masking: Masking) -> bool:
    """Whether the ``triton`` route computes this call: positions are runs, and the prior folds, is
    relative (a lag table) or, causal, a function of a scaled lag (FIRE, interpolated)."""
    if masking.starts is None:
        return False
    return (
        prior is None
        or prior.can_fold(masking.causal)
        or tabulates(prior, masking)
        or interpolates(prior, masking)
    )


#: Cells of the grid on which the ``triton`` route interpolates a prior of a scaled lag (FIRE), in
#: ``[0, 1]``: FIRE's MLP is exact on every cell without a kink, within 1 / (4 GRID_CELLS) of each
#: kink's bend inside one (:meth:`~priorattn.priors.FIRE.grid_error_bound`).
GRID_CELLS = 1024

#: Tiles on CUDA (a Hopper card's shared memory holds them at head width 128) and in the interpreter,
#: where small tiles keep the tests' shapes spread over several blocks. Tests may replace them.
BLOCKS = {"cuda": Blocks(), "cpu": Blocks(16, 16, 16, 16, 1, 1)}


def triton_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    prior: Prior | None,
    masking: Masking,
    scale: float,
    ssmax: Scaling | None,
    key_bias: Tensor | None = None,
) -> Tensor:
    """Prior attention through the fused Triton kernels, forward and backward."""
    if not triton_available(q.device):
        raise RuntimeError(
            "backend='triton' needs the triton package and a CUDA device (on the CPU: TRITON_INTERPRET=1, "
            "Triton's interpreter, slow); use backend='auto'"
        )
    if masking.starts is None:
        raise ValueError(
            "backend='triton' needs positions that are runs (start + arange), shared by the batch; "
            "use backend='flex' on CUDA or 'memeff' for other positions"
        )
    if prior is not None and not triton_takes(prior, masking):
        raise ValueError(
            f"backend='triton' needs a prior that folds, is relative (a lag table) or, causal on "
            f"positions >= 0, is a function of a scaled lag (FIRE); {type(prior).__name__} here is "
            "none of these: use backend='memeff'"
        )
    B, H, Lq, _ = q.shape
    Lk = k.shape[2]
    dtype = compute_dtype(q.dtype)
    factor = None if ssmax is None else ssmax.factor(masking.visible_keys()).to(dtype)
    row_factor = prior_factor(q, prior, factor, ssmax is not None and ssmax.scale_prior)
    # The kernels scale the content scores in float32; float64 inputs, and rows SSMax scales, come
    # scaled (the kernels' scale is then 1).
    scaled_in_kernels = factor is None and q.dtype != torch.float64
    content = q if scaled_in_kernels else content_queries(q.to(dtype), scale, factor).to(q.dtype)
    q_lanes = k_lanes = slope = table = grid = None
    if key_bias is not None:
        key_bias = key_bias.to(torch.promote_types(key_bias.dtype, dtype))
    if prior is not None and prior.can_fold(masking.causal):
        lanes = with_key_bias(fold_at(prior, masking), key_bias)
        if lanes.q.shape[-1]:  # the key lanes, shared by every head and row, stay a broadcast view
            q_lanes = query_lanes(content, lanes.q, row_factor)
            k_lanes = lanes.k.to(k.dtype).expand(B, k.shape[1], Lk, lanes.q.shape[-1])
        key_bias, slope = lanes.key_bias, lanes.slope
    elif prior is not None and prior.is_scaled_lag:
        grid = scaled_lag(prior, masking, GRID_CELLS)
    elif prior is not None:
        table = lag_table(prior, masking)
    # a key bias in float64 (FoX's sums) is split into the kernel's dtype and what rounding dropped
    key_lo = None
    if key_bias is not None:
        hi = key_bias.to(dtype)
        if key_bias.dtype != dtype:
            key_lo = (key_bias.detach() - hi.detach().to(key_bias.dtype)).to(dtype).expand(B, H, Lk)
        key_bias = hi.expand(B, H, Lk)
    q0, k0 = masking.starts
    out, _ = fused(
        content.contiguous(),
        k.contiguous(),
        v.contiguous(),
        _rows(q_lanes),
        _rows(k_lanes),
        _contiguous(key_bias),
        _contiguous(slope),
        _contiguous(table),
        None if row_factor is None else row_factor.to(dtype).expand(B, H, Lq, 1)[..., 0].contiguous(),
        None if grid is None else grid.lag_scale.to(dtype).contiguous(),
        None if grid is None else grid.row_scale.to(dtype).contiguous(),
        None if grid is None else grid.grid.to(dtype).contiguous(),
        _contiguous(key_lo),
        _contiguous(masking.q_doc, torch.int32),
        _contiguous(masking.k_doc, torch.int32),
        _contiguous(masking.key_padding, torch.int8),
        masking.causal,
        q0 - k0,
        masking.window,
        scale if scaled_in_kernels else 1.0,
        list(BLOCKS["cuda" if q.device.type == "cuda" else "cpu"]),
    )
    return out


def _contiguous(t: Tensor | None, dtype: torch.dtype | None = None) -> Tensor | None:
    return None if t is None else t.to(dtype or t.dtype).contiguous()


def _rows(t: Tensor | None) -> Tensor | None:
    """``t`` whose last dimension is contiguous, the others as they are (a broadcast's stride 0)."""
    return t if t is None or t.stride(-1) == 1 else t.contiguous()
