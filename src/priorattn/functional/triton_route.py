"""The Triton route: one fused kernel for the forward pass and two for the backward, with the prior's
terms computed inside them and its gradients reduced in registers (``triton_forward.py``,
``triton_backward.py``).

It takes every prior that folds (ALiBi, GOAT with or without its slope, Sandwich) and every relative
prior on position runs (GGD, T5, KERPLE: a lag table), with the op's key bias (FoX's ``-F_j``), SSMax
and a prior's query gate, under causal order, documents, key padding and a sliding window, with
grouped-query attention. Positions must be runs (the defaults, or any ``start + arange``), where the
lag is ``q0 - k0 + i - j``; other positions and priors that neither fold nor tabulate (FIRE) are
refused with the route to use.

The kernels are registered as an operator with its backward (``priorattn::fused_attention``), so a
model that takes this route compiles as one graph (``torch.compile(fullgraph=True)``): inductor
fuses the preparation around it and leaves the kernels as they are.

Triton runs on CUDA; on the CPU only under ``TRITON_INTERPRET=1`` (Triton's interpreter, which the
tests use to compare the kernels with the float64 reference).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from ..priors import Prior
from ..ssmax import Scaling
from .masks import Masking
from .prior_inputs import content_queries, lag_table, prior_factor, query_lanes, tabulates, with_key_bias
from .reference import compute_dtype


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
    """Whether the ``triton`` route computes this call: positions are runs, and the prior folds or
    is relative (a lag table)."""
    if masking.starts is None:
        return False
    return prior is None or prior.can_fold(masking.causal) or tabulates(prior, masking)


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
            f"backend='triton' needs a prior that folds or is relative (a lag table); "
            f"{type(prior).__name__} here is neither: use backend='memeff'"
        )
    B, H, Lq, _ = q.shape
    Lk = k.shape[2]
    dtype = compute_dtype(q.dtype)
    factor = None if ssmax is None else ssmax.factor(masking.visible_keys()).to(dtype)
    row_factor = prior_factor(q, prior, factor, ssmax is not None and ssmax.scale_prior)
    content = content_queries(q.to(dtype), scale, factor).to(q.dtype)
    q_lanes = k_lanes = slope = table = None
    if key_bias is not None:
        key_bias = key_bias.to(torch.promote_types(key_bias.dtype, dtype))
    if prior is not None and prior.can_fold(masking.causal):
        lanes = with_key_bias(prior.fold(masking.q_pos, masking.k_pos), key_bias)
        if lanes.q.shape[-1]:
            q_lanes = query_lanes(content, lanes.q, row_factor)
            k_lanes = lanes.k.to(k.dtype).expand(B, k.shape[1], Lk, lanes.q.shape[-1])
        key_bias, slope = lanes.key_bias, lanes.slope
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
    doc = lambda ids: None if ids is None else ids.to(torch.int32).contiguous()  # noqa: E731
    out, _ = fused(
        content.contiguous(),
        k.contiguous(),
        v.contiguous(),
        None if q_lanes is None else q_lanes.contiguous(),
        None if k_lanes is None else k_lanes.contiguous(),
        None if key_bias is None else key_bias.contiguous(),
        None if key_lo is None else key_lo.contiguous(),
        None if slope is None else slope.to(dtype).contiguous(),
        None if table is None else table.to(dtype).expand(H, -1).contiguous(),
        None if row_factor is None else row_factor.to(dtype).expand(B, H, Lq, 1)[..., 0].contiguous(),
        doc(masking.q_doc),
        doc(masking.k_doc),
        None if masking.key_padding is None else masking.key_padding.to(torch.int8).contiguous(),
        masking.causal,
        q0 - k0,
        masking.window,
        list(BLOCKS["cuda" if q.device.type == "cuda" else "cpu"]),
    )
    return out


@dataclass(frozen=True)
class Plan:
    """What one call's kernels need beside the differentiable inputs: masks and the key bias's rounding."""

    causal: bool
    delta: int  # q_pos[0] - k_pos[0]
    window: int | None
    q_doc: Tensor | None  # (B, Lq) int32
    k_doc: Tensor | None  # (B, Lk) int32
    padding: Tensor | None  # (B, Lk) int8, 1 marks a padding key
    key_lo: Tensor | None  # (B, H, Lk): what rounding the key bias to the kernel's dtype dropped
    blocks: Blocks


def _width(n: int) -> int:
    """A tile width for ``n`` lanes: a power of two, at least 16 (``tl.dot``'s smallest)."""
    return max(16, 1 << max(0, n - 1).bit_length())


#: The differentiable inputs of :func:`fused_attention`, in order (each absent one None).
DIFFERENTIABLE = ("q", "k", "v", "q_lanes", "k_lanes", "key_bias", "slope", "table", "row_factor")


def _fused_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_lanes: Tensor | None,
    k_lanes: Tensor | None,
    key_bias: Tensor | None,
    key_lo: Tensor | None,
    slope: Tensor | None,
    table: Tensor | None,
    row_factor: Tensor | None,
    q_doc: Tensor | None,
    k_doc: Tensor | None,
    padding: Tensor | None,
    causal: bool,
    delta: int,
    window: int | None,
    blocks: list[int],
) -> tuple[Tensor, Tensor]:
    """``(out, lse)`` of the fused kernels (the body of :data:`fused_attention`). Shapes
    whole (no broadcast): q ``(B, H, Lq, D)`` already scaled, k ``(B, Hkv, Lk, D)``, v ``(B, Hkv,
    Lk, Dv)``, lanes ``(B, H or Hkv, L, P)``, key bias and its rounding ``key_lo`` ``(B, H, Lk)``,
    slope ``(H,)``, table ``(H, Lq + Lk - 1)``, row factor ``(B, H, Lq)``, document ids ``(B, L)``
    int32, padding ``(B, Lk)`` int8 (1 marks a padding key); ``delta = q_pos[0] - k_pos[0]``;
    ``blocks`` the fields of :class:`Blocks`."""
    plan = Plan(causal, delta, window, q_doc, k_doc, padding, key_lo, Blocks(*blocks))
    return _forward(q, k, v, q_lanes, k_lanes, key_bias, slope, table, row_factor, plan)


#: The kernels as an operator that ``torch.compile`` keeps whole in its graph, forward and backward.
fused_attention = torch.library.custom_op("priorattn::fused_attention", _fused_forward, mutates_args=())


@fused_attention.register_fake
def _(q, k, v, q_lanes, k_lanes, key_bias, key_lo, slope, table, row_factor, *rest):
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
    key_lo: Tensor | None,
    slope: Tensor | None,
    table: Tensor | None,
    row_factor: Tensor | None,
    q_doc: Tensor | None,
    k_doc: Tensor | None,
    padding: Tensor | None,
    causal: bool,
    delta: int,
    window: int | None,
    blocks: list[int],
    needs: list[bool],
) -> list[Tensor]:
    """The gradients of :data:`fused_attention`'s :data:`DIFFERENTIABLE` inputs, in order, where
    ``needs`` asks for them and the input is present (an empty tensor stands for each other)."""
    plan = Plan(causal, delta, window, q_doc, k_doc, padding, key_lo, Blocks(*blocks))
    inputs = (q, k, v, q_lanes, k_lanes, key_bias, slope, table, row_factor)
    grads = _backward(grad_out, out, lse, *inputs, plan, needs)
    return [q.new_empty(0) if g is None else g for g in grads]


fused_attention_backward = torch.library.custom_op(
    "priorattn::fused_attention_backward", _fused_backward, mutates_args=()
)


@fused_attention_backward.register_fake
def _(grad_out, out, lse, *args):
    inputs, needs = args[:10], args[-1]
    inputs = inputs[:6] + inputs[7:]  # without key_lo
    return [
        grad_out.new_empty(0) if t is None or not need else torch.empty_like(t)
        for t, need in zip(inputs, needs)
    ]


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:13], *output)
    ctx.static = inputs[13:]


def _gradients(ctx, grad_out, backward) -> tuple:
    """The gradients of every input of :data:`fused_attention` (None where there is none), the
    kernels called through ``backward``: the operator where compiled, its body in eager."""
    *inputs, out, lse = ctx.saved_tensors
    needs = list(ctx.needs_input_grad[: len(DIFFERENTIABLE) + 1])
    needs = needs[:6] + needs[7:]  # key_lo is not differentiated
    present = [t is not None for t in inputs[:6] + inputs[7:10]]
    grads = backward(grad_out.contiguous(), out, lse, *inputs, *ctx.static, needs)
    grads = [g if need and there else None for g, need, there in zip(grads, needs, present)]
    return (*grads[:6], None, *grads[6:], *(None,) * 7)


fused_attention.register_autograd(
    lambda ctx, grad_out, _: _gradients(ctx, grad_out, fused_attention_backward), setup_context=_setup_context
)


class FusedAttention(torch.autograd.Function):
    """:data:`fused_attention` in eager mode, where the operator's dispatch would cost about 0.3 ms of
    host time a call (measured on this project's CPU): the same body, context and gradients."""

    @staticmethod
    def forward(ctx, *args):
        output = _fused_forward(*args)
        _setup_context(ctx, args, output)
        ctx.mark_non_differentiable(output[1])
        return output

    @staticmethod
    def backward(ctx, grad_out, _grad_lse):
        return _gradients(ctx, grad_out, _fused_backward)


def fused(*args) -> tuple[Tensor, Tensor]:
    """``(out, lse)``: the operator under ``torch.compile``, its autograd twin in eager mode."""
    if torch.compiler.is_compiling():
        return fused_attention(*args)
    return FusedAttention.apply(*args)


def _forward(q, k, v, q_lanes, k_lanes, key_bias, slope, table, row_factor, plan: Plan):
    from .triton_forward import forward_kernel

    B, H, Lq, D = q.shape
    Hkv, Lk, Dv = k.shape[1], k.shape[2], v.shape[3]
    out = torch.empty(B, H, Lq, Dv, dtype=v.dtype, device=q.device)
    lse = torch.empty(B, H, Lq, dtype=_acc(q.dtype), device=q.device)
    args = _common(q, k, v, q_lanes, k_lanes, key_bias, slope, table, row_factor, plan)
    blocks = plan.blocks
    grid = (triton_cdiv(Lq, blocks.query_rows), B * H)
    forward_kernel[grid](
        q,
        k,
        v,
        _or(q_lanes, q),
        _or(k_lanes, k),
        out,
        lse,
        *args["prior"],
        *args["masks"],
        H,
        H // Hkv,
        Lq,
        Lk,
        plan.delta,
        plan.window or 0,
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


def _backward(grad_out, out, lse, q, k, v, q_lanes, k_lanes, key_bias, slope, table, row_factor, plan, needs):
    """The gradients of the :data:`DIFFERENTIABLE` inputs (None where absent or not needed)."""
    from .triton_backward import key_block_kernel, query_block_kernel

    blocks = plan.blocks
    B, H, Lq, D = q.shape
    Hkv, Lk, Dv = k.shape[1], k.shape[2], v.shape[3]
    acc = _acc(q.dtype)
    delta_rows = (grad_out.to(acc) * out.to(acc)).sum(-1)  # (B, H, Lq): rowsum(dO o)
    args = _common(q, k, v, q_lanes, k_lanes, key_bias, slope, table, row_factor, plan)
    P = args["P"]
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    dkl = None if k_lanes is None else torch.empty_like(k_lanes)
    du = None if key_bias is None else torch.empty(B, H, Lk, dtype=acc, device=q.device)
    key_blocks = triton_cdiv(Lk, blocks.key_rows)
    dslope = None if slope is None else torch.zeros(B * H, key_blocks, dtype=acc, device=q.device)
    dtable = None if table is None else torch.zeros(H, Lq + Lk - 1, dtype=acc, device=q.device)
    square = blocks.key_query_cols if table is None else blocks.key_rows
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
        *args["prior"],
        *args["masks"],
        H,
        H // Hkv,
        Lq,
        Lk,
        plan.delta,
        plan.window or 0,
        D,
        Dv,
        P,
        key_blocks,
        BLOCK_M=square,
        BLOCK_N=blocks.key_rows,
        **args["flags"],
        KEY_BIAS_GRAD=du is not None and needs[5],
        SLOPE_GRAD=dslope is not None and needs[6],
        TABLE_GRAD=dtable is not None and needs[7],
        num_warps=blocks.num_warps,
        num_stages=blocks.num_stages,
    )
    dq = torch.empty_like(q)
    dql = None if q_lanes is None else torch.empty_like(q_lanes)
    df = None if row_factor is None else torch.empty(B, H, Lq, dtype=acc, device=q.device)
    row_sums = None if du is None else torch.empty(B, H, Lq, dtype=acc, device=q.device)
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
        _or(row_sums, lse),
        *args["prior"],
        *args["masks"],
        H,
        H // Hkv,
        Lq,
        Lk,
        plan.delta,
        plan.window or 0,
        D,
        Dv,
        P,
        BLOCK_M=blocks.query_rows,
        BLOCK_N=blocks.key_cols,
        **args["flags"],
        ROW_FACTOR_GRAD=df is not None and needs[8],
        KEY_BIAS_GRAD=row_sums is not None,
        num_warps=blocks.num_warps,
        num_stages=blocks.num_stages,
    )
    if row_sums is not None:
        # The kernels add u_j - u_t(i): the centre's gradient, minus f_i times row i's sum of dS,
        # is 0 in exact arithmetic, but a recomputed softmax's rows of dS do not sum to exactly
        # 0, and FoX's gate sums its key bias's gradient over all later keys, where these
        # leftovers pile up. Differentiating what the kernels computed cancels them.
        own = (torch.arange(Lq, device=q.device) + (Lk - Lq)).clamp(0, Lk - 1).expand(B, H, Lq)
        weighted = row_sums if row_factor is None else row_sums * row_factor.to(acc)
        du.scatter_add_(2, own, -weighted)
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


def _common(q, k, v, q_lanes, k_lanes, key_bias, slope, table, row_factor, plan: Plan) -> dict:
    """The kernels' shared arguments: the prior's tensors with their strides, the masks, the flags."""
    import triton.language as tl

    stand_in = q
    prior = (
        _or(key_bias, stand_in),
        _or(plan.key_lo, stand_in),
        *((0, 0) if key_bias is None else key_bias.stride()[:2]),
        _or(slope, stand_in),
        _or(table, stand_in),
        0 if table is None else table.stride(0),
        _or(row_factor, stand_in),
        *((0, 0) if row_factor is None else row_factor.stride()[:2]),
    )
    masks = (
        _or(plan.q_doc, stand_in),
        _or(plan.k_doc, stand_in),
        0 if plan.q_doc is None else plan.q_doc.stride(0),
        0 if plan.k_doc is None else plan.k_doc.stride(0),
        _or(plan.padding, stand_in),
        0 if plan.padding is None else plan.padding.stride(0),
    )
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
        CAUSAL=plan.causal,
        HAS_WINDOW=plan.window is not None,
        HAS_DOCS=plan.q_doc is not None,
        HAS_PADDING=plan.padding is not None,
        # masks every tile needs; without them only tiles the causal diagonal or the last key cuts
        ALWAYS_MASK=plan.window is not None or plan.q_doc is not None or plan.padding is not None,
        ACC=tl.float64 if q.dtype == torch.float64 else tl.float32,
        PRECISION="ieee" if q.dtype in (torch.float32, torch.float64) else "tf32",
    )
    return dict(prior=prior, masks=masks, P=P, flags=flags)
