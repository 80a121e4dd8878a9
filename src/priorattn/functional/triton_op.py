"""The ``triton`` route's operator: the fused kernels (``triton_forward.py``, ``triton_backward.py``)
launched for one call, forward and backward, registered as ``priorattn::fused_attention`` with its
backward so that ``torch.compile`` keeps them whole in its graph, and an ``autograd.Function`` twin
that eager calls take (the operator's dispatch costs host time on every call). The route that
prepares the prior's inputs for it is ``triton_route.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor


class Blocks(NamedTuple):
    """Tile sizes: the forward and query-block kernels take ``query_rows x key_cols`` tiles, the
    key-block kernel ``key_rows`` keys against ``key_query_cols`` queries (square where a lag table's
    gradient gathers diagonals)."""

    query_rows: int = 128
    key_cols: int = 64
    key_rows: int = 64
    key_query_cols: int = 64
    num_warps: int = 4
    num_stages: int = 2


@dataclass(frozen=True)
class Plan:
    """What one call's kernels need beside the differentiable inputs: masks and the key bias's rounding."""

    causal: bool
    delta: int  # q_pos[0] - k_pos[0]
    window: int | None
    scale: float  # of the content scores, in the kernels' float32 (1.0: q comes scaled)
    q_doc: Tensor | None  # (B, Lq) int32
    k_doc: Tensor | None  # (B, Lk) int32
    padding: Tensor | None  # (B, Lk) int8, 1 marks a padding key
    key_lo: Tensor | None  # (B, H, Lk): what rounding the key bias to the kernel's dtype dropped
    blocks: Blocks


def _width(n: int) -> int:
    """A tile width for ``n`` lanes: a power of two, at least 16 (``tl.dot``'s smallest)."""
    return max(16, 1 << max(0, n - 1).bit_length())


#: The differentiable inputs of :data:`fused_attention`, its first, in order (each absent one None).
DIFFERENTIABLE = (
    "q",
    "k",
    "v",
    "q_lanes",
    "k_lanes",
    "key_bias",
    "slope",
    "table",
    "row_factor",
    "lag_scale",
    "row_scale",
    "grid",
)


def _fused_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_lanes: Tensor | None,
    k_lanes: Tensor | None,
    key_bias: Tensor | None,
    slope: Tensor | None,
    table: Tensor | None,
    row_factor: Tensor | None,
    lag_scale: Tensor | None,
    row_scale: Tensor | None,
    grid: Tensor | None,
    key_lo: Tensor | None,
    q_doc: Tensor | None,
    k_doc: Tensor | None,
    padding: Tensor | None,
    causal: bool,
    delta: int,
    window: int | None,
    scale: float,
    blocks: list[int],
) -> tuple[Tensor, Tensor]:
    """``(out, lse)`` of the fused kernels (the body of :data:`fused_attention`). Shapes whole (no
    broadcast, but the lanes and a lag table shared by the heads): q ``(B, H, Lq, D)``, whose scores
    the kernels multiply by ``scale``, k ``(B, Hkv, Lk, D)``, v ``(B, Hkv, Lk, Dv)``, lanes ``(B, H,
    Lq, P)`` and ``(B, Hkv, Lk, P)`` (any strides but the last, 1: a broadcast's are 0), key bias
    and its rounding ``key_lo`` ``(B, H, Lk)``, slope ``(H,)``, table ``(H or 1, Lq + Lk - 1)``
    (lanes, slope and table in any floating dtype: the kernels read them in theirs), row factor
    ``(B, H, Lq)``, a scaled lag's ``lag_scale`` ``(Lq + Lk - 1,)``, ``row_scale`` ``(Lq,)`` and
    ``grid`` ``(H, cells + 1)`` (:class:`~priorattn.priors.ScaledLag`), document ids ``(B, L)``
    int32, padding ``(B, Lk)`` int8 (1 marks a padding key); ``delta = q_pos[0] - k_pos[0]``;
    ``blocks`` the fields of :class:`Blocks`."""
    plan = Plan(causal, delta, window, scale, q_doc, k_doc, padding, key_lo, Blocks(*blocks))
    return _forward(*_inputs(locals()), plan)


def _inputs(arguments: dict) -> tuple:
    return tuple(arguments[name] for name in DIFFERENTIABLE)


#: The kernels as an operator that ``torch.compile`` keeps whole in its graph, forward and backward.
fused_attention = torch.library.custom_op("priorattn::fused_attention", _fused_forward, mutates_args=())


@fused_attention.register_fake
def _(q, k, v, *rest):
    B, H, Lq, _ = q.shape
    out = q.new_empty(B, H, Lq, v.shape[3], dtype=v.dtype)
    return out, q.new_empty(B, H, Lq, dtype=_acc(q.dtype))


def _fused_backward(
    grad_out: Tensor,
    out: Tensor,
    lse: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_lanes: Tensor | None,
    k_lanes: Tensor | None,
    key_bias: Tensor | None,
    slope: Tensor | None,
    table: Tensor | None,
    row_factor: Tensor | None,
    lag_scale: Tensor | None,
    row_scale: Tensor | None,
    grid: Tensor | None,
    key_lo: Tensor | None,
    q_doc: Tensor | None,
    k_doc: Tensor | None,
    padding: Tensor | None,
    causal: bool,
    delta: int,
    window: int | None,
    scale: float,
    blocks: list[int],
    needs: list[bool],
) -> list[Tensor]:
    """The gradients of :data:`fused_attention`'s :data:`DIFFERENTIABLE` inputs, in order, where
    ``needs`` asks for them and the input is present (an empty tensor stands for each other)."""
    plan = Plan(causal, delta, window, scale, q_doc, k_doc, padding, key_lo, Blocks(*blocks))
    grads = _backward(grad_out, out, lse, *_inputs(locals()), plan, needs)
    return [q.new_empty(0) if g is None else g for g in grads]


fused_attention_backward = torch.library.custom_op(
    "priorattn::fused_attention_backward", _fused_backward, mutates_args=()
)


@fused_attention_backward.register_fake
def _(grad_out, out, lse, *args):
    inputs, needs = args[: len(DIFFERENTIABLE)], args[-1]
    return [
        grad_out.new_empty(0) if t is None or not need else torch.empty_like(t)
        for t, need in zip(inputs, needs)
    ]


#: How many of :data:`fused_attention`'s arguments are tensors (the differentiable ones, then the
#: key bias's rounding, document ids and padding); the rest are plain values.
TENSORS = len(DIFFERENTIABLE) + 4


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:TENSORS], *output)
    ctx.static = inputs[TENSORS:]


def _gradients(ctx, grad_out, backward) -> tuple:
    """The gradients of every input of :data:`fused_attention` (None where there is none), the
    kernels called through ``backward``: the operator where compiled, its body in eager."""
    *inputs, out, lse = ctx.saved_tensors
    count = len(DIFFERENTIABLE)
    needs = [need and t is not None for need, t in zip(ctx.needs_input_grad[:count], inputs)]
    grads = backward(grad_out.contiguous(), out, lse, *inputs, *ctx.static, needs)
    grads = [g if need else None for g, need in zip(grads, needs)]
    return (*grads, *(None,) * (len(inputs) - count + len(ctx.static)))


fused_attention.register_autograd(
    lambda ctx, grad_out, _: _gradients(ctx, grad_out, fused_attention_backward), setup_context=_setup_context
)


class FusedAttention(torch.autograd.Function):
    """:data:`fused_attention` in eager mode, where the operator's dispatch would cost host time on
    every call (docs/priors.md): the same body, context and gradients."""

    @staticmethod
    def forward(ctx, *args):
        output = _fused_forward(*args)
        _setup_context(ctx, args, output)
        ctx.mark_non_differentiable(output[1])
        ctx.set_materialize_grads(False)  # the log-sum-exp's gradient, never read, stays None: no zeros
        return output

    @staticmethod
    def backward(ctx, grad_out, _grad_lse):
        return _gradients(ctx, grad_out, _fused_backward)


def fused(*args) -> tuple[Tensor, Tensor]:
    """``(out, lse)``: the operator under ``torch.compile``, its autograd twin in eager mode."""
    if torch.compiler.is_compiling():
        return fused_attention(*args)
    return FusedAttention.apply(*args)


def _forward(
    q, k, v, q_lanes, k_lanes, key_bias, slope, table, row_factor, lag_scale, row_scale, grid, plan: Plan
):
    from .triton_forward import forward_kernel

    B, H, Lq, D = q.shape
    Hkv, Lk, Dv = k.shape[1], k.shape[2], v.shape[3]
    out = torch.empty(B, H, Lq, Dv, dtype=v.dtype, device=q.device)
    lse = torch.empty(B, H, Lq, dtype=_acc(q.dtype), device=q.device)
    args = _common(
        q, k, v, q_lanes, k_lanes, key_bias, slope, table, row_factor, lag_scale, row_scale, grid, plan
    )
    blocks = plan.blocks
    forward_kernel[(triton_cdiv(Lq, blocks.query_rows), B * H)](
        q,
        k,
        v,
        _or(q_lanes, q),
        _or(k_lanes, k),
        out,
        lse,
        *args["prior"],
        *args["masks"],
        *args["lanes"],
        H,
        H // Hkv,
        Lq,
        Lk,
        plan.delta,
        plan.window or 0,
        plan.scale,
        D,
        Dv,
        args["P"],
        BLOCK_M=blocks.query_rows,
        BLOCK_N=blocks.key_cols,
        **args["flags"],
        num_warps=blocks.num_warps,
        num_stages=blocks.num_stages,
    )
    return out, lse


def _backward(
    grad_out,
    out,
    lse,
    q,
    k,
    v,
    q_lanes,
    k_lanes,
    key_bias,
    slope,
    table,
    row_factor,
    lag_scale,
    row_scale,
    grid,
    plan,
    needs,
):
    """The gradients of the :data:`DIFFERENTIABLE` inputs (None where absent or not needed)."""
    from .triton_backward import delta_rows_kernel, key_block_kernel, query_block_kernel

    blocks = plan.blocks
    B, H, Lq, D = q.shape
    Hkv, Lk, Dv = k.shape[1], k.shape[2], v.shape[3]
    acc = _acc(q.dtype)
    delta_rows = torch.empty(B, H, Lq, dtype=acc, device=q.device)  # rowsum(dO o)
    args = _common(
        q, k, v, q_lanes, k_lanes, key_bias, slope, table, row_factor, lag_scale, row_scale, grid, plan
    )
    P = args["P"]
    delta_rows_kernel[(triton_cdiv(B * H * Lq, blocks.query_rows),)](
        out,
        grad_out,
        delta_rows,
        B * H * Lq,
        Dv,
        BLOCK_M=blocks.query_rows,
        BLOCK_DV=args["flags"]["BLOCK_DV"],
        ACC=args["flags"]["ACC"],
        num_warps=blocks.num_warps,
    )
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    # lanes may be broadcast views: their gradients are whole (autograd sums them back)
    dkl = None if k_lanes is None else k_lanes.new_empty(k_lanes.shape)
    # the prior's gradients: buffers only for those asked for (``needs[i]``: asked and present)
    du = torch.empty(B, H, Lk, dtype=acc, device=q.device) if needs[5] else None
    key_blocks = triton_cdiv(Lk, blocks.key_rows)
    # every (batch row, head, key block) stores its partial sum: no zeros to start from
    dslope = torch.empty(B * H, key_blocks, dtype=acc, device=q.device) if needs[6] else None
    dtable = torch.zeros(H, Lq + Lk - 1, dtype=acc, device=q.device) if needs[7] else None
    dgrid = torch.zeros(H, grid.shape[1], dtype=acc, device=q.device) if needs[11] else None
    dlag = torch.zeros(H, Lq + Lk - 1, dtype=acc, device=q.device) if needs[9] else None
    diagonals = dtable is not None or dlag is not None
    square = blocks.key_rows if diagonals else blocks.key_query_cols
    key_block_kernel[(key_blocks, B * Hkv)](
        q,
        k,
        v,
        _or(q_lanes, q),
        _or(k_lanes, k),
        grad_out,
        lse,
        delta_rows,
        dk,
        dv,
        _or(dkl, dk),
        _or(du, lse),
        _or(dslope, lse),
        _or(dtable, lse),
        0 if dtable is None else dtable.stride(0),
        _or(dgrid, lse),
        _or(dlag, lse),
        *args["prior"],
        *args["masks"],
        *args["lanes"],
        H,
        H // Hkv,
        Lq,
        Lk,
        plan.delta,
        plan.window or 0,
        plan.scale,
        D,
        Dv,
        P,
        key_blocks,
        BLOCK_M=square,
        BLOCK_N=blocks.key_rows,
        **args["flags"],
        KEY_BIAS_GRAD=du is not None,
        SLOPE_GRAD=dslope is not None,
        TABLE_GRAD=dtable is not None,
        GRID_GRAD=dgrid is not None,
        LAG_SCALE_GRAD=dlag is not None,
        num_warps=blocks.num_warps,
        num_stages=blocks.num_stages,
    )
    dq = torch.empty_like(q)
    dql = None if q_lanes is None else q_lanes.new_empty(q_lanes.shape)
    df = torch.empty(B, H, Lq, dtype=acc, device=q.device) if needs[8] else None
    drow = torch.empty(B, H, Lq, dtype=acc, device=q.device) if needs[10] else None
    query_block_kernel[(triton_cdiv(Lq, blocks.query_rows), B * H)](
        q,
        k,
        v,
        _or(q_lanes, q),
        _or(k_lanes, k),
        grad_out,
        lse,
        delta_rows,
        dq,
        _or(dql, dq),
        _or(df, lse),
        _or(du, lse),
        _or(drow, lse),
        *args["prior"],
        *args["masks"],
        *args["lanes"],
        H,
        H // Hkv,
        Lq,
        Lk,
        plan.delta,
        plan.window or 0,
        plan.scale,
        D,
        Dv,
        P,
        BLOCK_M=blocks.query_rows,
        BLOCK_N=blocks.key_cols,
        **args["flags"],
        ROW_FACTOR_GRAD=df is not None,
        KEY_BIAS_GRAD=du is not None,
        ROW_SCALE_GRAD=drow is not None,
        num_warps=blocks.num_warps,
        num_stages=blocks.num_stages,
    )
    if dtable is not None and table.shape[0] == 1:  # a table shared by the heads: their sum
        dtable = dtable.sum(0, keepdim=True)
    grads = (
        dq,
        dk,
        dv,
        dql,
        dkl,
        None if du is None else du.to(key_bias.dtype),
        None if dslope is None else dslope.view(B, H, key_blocks).sum((0, 2)).to(slope.dtype),
        None if dtable is None else dtable.to(table.dtype),
        None if df is None else df.to(row_factor.dtype),
        None if dlag is None else dlag.sum(0).to(lag_scale.dtype),
        None if drow is None else drow.sum((0, 1)).to(row_scale.dtype),
        None if dgrid is None else dgrid.to(grid.dtype),
    )
    return tuple(g if need else None for g, need in zip(grads, needs))


def _acc(dtype: torch.dtype) -> torch.dtype:
    """The kernels' accumulation dtype: float64 for float64 inputs, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _or(t: Tensor | None, stand_in: Tensor) -> Tensor:
    """``t``, or a tensor that stands in for an absent one (a kernel argument never read)."""
    return stand_in if t is None else t


def triton_cdiv(n: int, block: int) -> int:
    return -(-n // block)


def _common(
    q, k, v, q_lanes, k_lanes, key_bias, slope, table, row_factor, lag_scale, row_scale, grid, plan: Plan
) -> dict:
    """The kernels' shared arguments: the prior's tensors with their strides, the masks, the lanes'
    strides (batch, head, row), the flags."""
    import triton.language as tl

    stand_in = q
    prior = (
        _or(key_bias, stand_in),
        _or(plan.key_lo, stand_in),
        *((0, 0) if key_bias is None else key_bias.stride()[:2]),
        _or(slope, stand_in),
        _or(table, stand_in),
        0 if table is None or table.shape[0] == 1 else table.stride(0),  # one row: shared by the heads
        _or(row_factor, stand_in),
        *((0, 0) if row_factor is None else row_factor.stride()[:2]),
        _or(lag_scale, stand_in),
        _or(row_scale, stand_in),
        _or(grid, stand_in),
        0 if grid is None else grid.stride(0),
    )
    masks = (
        _or(plan.q_doc, stand_in),
        _or(plan.k_doc, stand_in),
        0 if plan.q_doc is None else plan.q_doc.stride(0),
        0 if plan.k_doc is None else plan.k_doc.stride(0),
        _or(plan.padding, stand_in),
        0 if plan.padding is None else plan.padding.stride(0),
    )
    lanes = (0,) * 6 if q_lanes is None else (*q_lanes.stride()[:3], *k_lanes.stride()[:3])
    P = 0 if q_lanes is None else q_lanes.shape[-1]
    flags = dict(
        BLOCK_D=_width(q.shape[-1]),
        BLOCK_DV=_width(v.shape[-1]),
        BLOCK_P=_width(P),
        HAS_LANES=q_lanes is not None,
        HAS_KEY_BIAS=key_bias is not None,
        HAS_LO=plan.key_lo is not None,
        HAS_SLOPE=slope is not None,
        HAS_TABLE=table is not None,
        HAS_ROW_FACTOR=row_factor is not None,
        HAS_GRID=grid is not None,
        GRID_CELLS=1 if grid is None else grid.shape[1] - 1,
        CAUSAL=plan.causal,
        HAS_WINDOW=plan.window is not None,
        HAS_DOCS=plan.q_doc is not None,
        HAS_PADDING=plan.padding is not None,
        # masks every tile needs; without them only tiles the causal diagonal or the last key cuts
        ALWAYS_MASK=plan.window is not None or plan.q_doc is not None or plan.padding is not None,
        ACC=tl.float64 if q.dtype == torch.float64 else tl.float32,
        PRECISION="ieee" if q.dtype in (torch.float32, torch.float64) else "tf32",
    )
    return dict(prior=prior, masks=masks, lanes=lanes, P=P, flags=flags)
