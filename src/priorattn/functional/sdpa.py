"""The SDPA route: fold the prior into extra q/k lanes and call unmodified SDPA.

Seed 000 Eq. 20-24 / Algorithm 1: ``q' = [scale * q, q_lanes, 1]``, ``k' = [k, k_lanes, key terms]``
and SDPA runs with its own scale set to 1, so the log-prior enters unscaled and no ``Lq x Lk`` bias
is ever built. Queries run in chunks only where needed, each against only the keys its queries can
see (``spans.py``: one mask-free call per document of a packed row, bands of queries under a
sliding window); a boolean mask is handed to SDPA only where no mask-free kernel fits, a few
million cells at a time, and a key-linear slope is re-centred on each chunk's queries.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..priors import FoldLanes, Prior
from ..ssmax import Scaling
from .grouped import grouped_scores, grouped_values
from .masks import Masking
from .prior_inputs import centred_keys, fold_dtype, lane_inputs, slope_span
from .reference import compute_dtype
from .spans import Call, Kind, batch_groups, cut, key_spans, select_rows, span_calls, visible_counts

#: Largest number of (query, key) cells of a boolean mask handed to SDPA in one call.
MASK_CHUNK_CELLS = 1 << 22
#: A decode step has at most this many queries (see :func:`sdpa_bias_attention`).
DECODE_QUERIES = 16
#: Largest bias tile ``B * H * Lq * Lk`` a decode step builds (64 MB in float32).
BIAS_TILE_CELLS = 1 << 24


def sdpa_inputs(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    lanes: FoldLanes | None,
    masking: Masking,
    rows: slice,
    cols: slice,
    scale: float,
    factor: Tensor | None,
    scale_prior: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """``q'``, ``k'``, ``v'`` of one SDPA call; ``q`` holds query ``rows``, ``k``, ``v`` key ``cols``."""
    if lanes is None:
        content = q * scale if factor is None else (q * scale * factor).to(q.dtype)
        return content, k, v
    q2, k2 = lane_inputs(q, k, lanes, rows, cols, scale, factor, scale_prior)
    B, H, lq = q.shape[:3]
    q_extra, k_extra = [], []
    if lanes.key_bias is not None:  # <1, u_h(j)>: per-head key lane, one key head per query head
        if k.shape[1] != H:
            k2, v = k2.repeat_interleave(H // k.shape[1], 1), v.repeat_interleave(H // k.shape[1], 1)
        q_extra.append(q2.new_ones(1, 1, 1, 1).expand(B, H, lq, 1))
        k_extra.append(lanes.key_bias[..., cols, None].expand(B, H, -1, 1))
    if lanes.slope is not None:  # <m_h, k_pos[j] - centre>: shared key lane
        q_extra.append(lanes.slope[:, None, None].expand(B, H, lq, 1))
        offset = centred_keys(masking, rows, cols, lanes.slope.dtype)
        k_extra.append(offset[:, None, :, None].expand(B, k2.shape[1], -1, 1))
    if not q_extra:
        return q2, k2, v
    q_extra = torch.cat(q_extra, dim=-1)
    if factor is not None and scale_prior:
        q_extra = q_extra * factor
    q2 = torch.cat([q2, q_extra.to(q2.dtype)], dim=-1)
    return q2, torch.cat([k2, torch.cat(k_extra, dim=-1).to(k2.dtype)], dim=-1), v


class LowerRightCausal(torch.autograd.Function):
    """Causal attention of the last ``Lq`` positions over ``Lk`` keys (SDPA scale 1), without a mask.

    Query i sees keys ``0 .. Lk - Lq + i``: an unmasked block over the ``Lk - Lq`` older keys plus a
    square causal block over the newest ``Lq``, each one call of the SDPA CPU kernel, merged by their
    log-sum-exp. The backward runs the kernel's own backward on each block with the merged output
    and log-sum-exp, which is exactly the softmax gradient restricted to that block's keys.
    The kernel wants one head width for q, k and v: the narrower side is padded with zero lanes.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        Dk, Dv = q.shape[-1], v.shape[-1]
        width = max(Dk, Dv)
        q, k, v = (t if t.shape[-1] == width else F.pad(t, (0, width - t.shape[-1])) for t in (q, k, v))
        past = k.shape[2] - q.shape[2]
        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        out, lse = flash(q, k[:, :, past:], v[:, :, past:], 0.0, True, scale=1.0)
        if past:
            out_old, lse_old = flash(q, k[:, :, :past], v[:, :, :past], 0.0, False, scale=1.0)
            total = torch.logaddexp(lse, lse_old)  # (B, H, Lq), float32
            out = out * (lse - total).exp()[..., None] + out_old * (lse_old - total).exp()[..., None]
            out, lse = out.to(q.dtype), total
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.widths = Dk, Dv
        return out[..., :Dv]

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        Dk, Dv = ctx.widths
        grad_out = F.pad(grad_out, (0, v.shape[-1] - Dv)).contiguous()
        past = k.shape[2] - q.shape[2]
        backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
        dq, dk, dv = backward(grad_out, q, k[:, :, past:], v[:, :, past:], out, lse, 0.0, True, scale=1.0)
        if past:
            dq_old, dk_old, dv_old = backward(
                grad_out, q, k[:, :, :past], v[:, :, :past], out, lse, 0.0, False, scale=1.0
            )
            dq, dk, dv = dq + dq_old, torch.cat([dk_old, dk], dim=2), torch.cat([dv_old, dv], dim=2)
        return dq[..., :Dk], dk[..., :Dk], dv[..., :Dv]


class Runs:
    """``t`` ``(B, heads, L, D)`` cut at the given bounds, read back one call's run at a time.

    Slicing the whole tensor for each call would cost the backward a zero-filled gradient of the
    whole tensor per call (O(L^2 / band) for a window's bands); the pieces of one ``split`` get
    theirs in one concatenation. A run is a piece, or a short ``cat`` of the pieces it spans.
    """

    def __init__(self, t: Tensor, bounds: list[int]):
        self.bounds = sorted({0, t.shape[2], *bounds})
        self.pieces = t.split([b - a for a, b in zip(self.bounds, self.bounds[1:])], dim=2)
        self.first = {bound: i for i, bound in enumerate(self.bounds)}

    def __getitem__(self, run: slice) -> Tensor:
        i, j = self.first[run.start], self.first[run.stop]
        return self.pieces[i] if j == i + 1 else torch.cat(self.pieces[i:j], dim=2)


def public_lower_right_causal(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """:class:`LowerRightCausal` with public operators only (any device): SDPA with torch's
    bottom-right causal bias, which CUDA runs in its flash or memory-efficient kernels without a
    mask (the CPU materialises one, so the CPU uses :class:`LowerRightCausal`)."""
    # Imported here: the module pulls in torch._dynamo (about 1 s and 70 MB at import), which CPU
    # runs, taking the CPU kernel, never need.
    from torch.nn.attention.bias import causal_lower_right

    bias = causal_lower_right(q.shape[2], k.shape[2])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=1.0)


def lower_right_kernel(device: torch.device) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    """Bottom-right causal attention for ``device``: the CPU flash kernel exists only on the CPU."""
    return LowerRightCausal.apply if device.type == "cpu" else public_lower_right_causal


def plan_calls(masking: Masking, spans: tuple[Tensor, Tensor] | None, step: int | None) -> list[Call]:
    """The kernel calls of one batch group, in query order, each covering at most ``step`` queries.

    ``spans`` are the group's key spans (rows identical across the group), or None: then plain
    causal masking and no masking need no data, and anything else takes dense masks in chunks.
    """
    Lq, Lk = masking.q_pos.shape[-1], masking.k_pos.shape[-1]
    if not masking.masks_anything:
        return [Call(rows, slice(0, Lk), Kind.FULL) for rows in cut(0, Lq, step)]
    if masking.plain_causal and Lq <= Lk:  # key index <= query index + (Lk - Lq)
        return [Call(rows, slice(0, Lk - Lq + rows.stop), Kind.CAUSAL) for rows in cut(0, Lq, step)]
    if spans is None:
        chunk = min(step or Lq, max(1, MASK_CHUNK_CELLS // max(Lk, 1)))
        return [Call(rows, slice(0, Lk), Kind.MASKED, masking.visible(rows)) for rows in cut(0, Lq, chunk)]
    lo, hi = spans
    padding = None if masking.key_padding is None else masking.key_padding[0]
    return span_calls(lo[0], hi[0], padding, masking.window, step, MASK_CHUNK_CELLS)


def attend(q2: Tensor, k2: Tensor, v2: Tensor, call: Call) -> Tensor:
    """One call of the SDPA kernel on folded inputs (scale 1), masked as ``call`` says."""
    gqa = q2.shape[1] != k2.shape[1]
    if call.kind is Kind.FULL:
        return F.scaled_dot_product_attention(q2, k2, v2, scale=1.0, enable_gqa=gqa)
    if call.kind is Kind.CAUSAL:
        if k2.shape[2] == q2.shape[2]:
            return F.scaled_dot_product_attention(q2, k2, v2, is_causal=True, scale=1.0, enable_gqa=gqa)
        if gqa:
            group = q2.shape[1] // k2.shape[1]
            k2, v2 = k2.repeat_interleave(group, dim=1), v2.repeat_interleave(group, dim=1)
        return lower_right_kernel(q2.device)(q2, k2, v2)
    out = F.scaled_dot_product_attention(q2, k2, v2, attn_mask=call.mask, scale=1.0, enable_gqa=gqa)
    return torch.where(call.mask.any(dim=-1, keepdim=True), out, 0.0)


def sdpa_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    prior: Prior | None,
    masking: Masking,
    scale: float,
    ssmax: Scaling | None,
) -> Tensor:
    """Prior attention through the SDPA kernel: one unmodified call unless chunks are needed.

    Batch rows whose key spans (document boundaries) or padding differ run as separate groups.
    """
    if prior is not None and not prior.can_fold(masking.causal):
        raise ValueError(
            f"backend='sdpa' needs a prior that folds into q/k lanes; {type(prior).__name__} does not"
            f"{' without a causal mask' if not masking.causal else ''}: use backend='memeff'"
        )
    spans = None
    if masking.masks_anything and not masking.plain_causal:
        spans = key_spans(masking)
    groups = None if spans is None else batch_groups(masking, *spans)
    if groups is None:
        return folded_attention(q, k, v, prior, masking, spans, scale, ssmax)
    # One gather into group order, then views per group: indexing q, k, v once per group would
    # cost the backward a zero-filled whole-batch gradient per group.
    order, sizes = torch.cat(groups), [len(index) for index in groups]
    qs, ks, vs = (t[order].split(sizes) for t in (q, k, v))
    outputs = []
    for index, q_g, k_g, v_g in zip(groups, qs, ks, vs):
        lo, hi = (t if t.shape[0] == 1 else t[index] for t in spans)
        group = select_rows(masking, index)
        outputs.append(folded_attention(q_g, k_g, v_g, prior, group, (lo, hi), scale, ssmax))
    return torch.cat(outputs)[order.argsort()]


def folded_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    prior: Prior | None,
    masking: Masking,
    spans: tuple[Tensor, Tensor] | None,
    scale: float,
    ssmax: Scaling | None,
) -> Tensor:
    """The prior folded into q/k lanes, through the calls of :func:`plan_calls`; rows that see no
    key return zeros."""
    counts = visible_counts(masking, spans) if ssmax is not None else None
    lanes = None if prior is None else prior.fold(masking.q_pos, masking.k_pos)
    scale_prior = ssmax is not None and ssmax.scale_prior
    dtype = q.dtype
    if lanes is not None:  # a half-precision slope computes in float32 rather than in tiny query runs
        compute = fold_dtype(lanes.slope, dtype, q.shape[2])
        q, k, v = q.to(compute), k.to(compute), v.to(compute)
    step = None if lanes is None else slope_span(lanes.slope, q.dtype)
    B, H, Lq = q.shape[:3]
    Dv, width = v.shape[-1], q.shape[-1] + (0 if lanes is None else lanes.width)
    if width > Dv:  # the flash kernel wants one head width for q, k and v (else SDPA takes a slow path)
        v = F.pad(v, (0, width - Dv))
    calls = plan_calls(masking, spans, step)
    queries = Runs(q, [bound for c in calls for bound in (c.rows.start, c.rows.stop)])
    keys = Runs(k, [bound for c in calls for bound in (c.cols.start, c.cols.stop)])
    values = Runs(v, keys.bounds)
    # Queries no call covers see no key and return zeros; taken from q's graph (a sum over no
    # lanes), so the output keeps a gradient (of zero) even when no query sees a key.
    unseen = q[..., :0].sum(-1, keepdim=True).expand(B, H, Lq, Dv)
    outputs, done = [], 0
    for call in calls:
        rows, cols = call.rows, call.cols
        if rows.start > done:
            outputs.append(unseen[:, :, done : rows.start])
        factor = None if counts is None else ssmax.factor(counts[:, rows])
        q2, k2, v2 = sdpa_inputs(
            queries[rows],
            keys[cols],
            values[cols],
            lanes,
            masking,
            rows,
            cols,
            scale,
            factor,
            scale_prior,
        )
        outputs.append(attend(q2, k2, v2, call)[..., :Dv])
        done = rows.stop
    if done < Lq:
        outputs.append(unseen[:, :, done:])
    out = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)
    return out.to(dtype)


def is_decode_step(q: Tensor, k: Tensor) -> bool:
    """A few queries against a longer cache, whose bias tile is small: :func:`sdpa_bias_attention`'s case."""
    B, H, Lq = q.shape[:3]
    Lk = k.shape[2]
    return Lq <= DECODE_QUERIES and Lq < Lk and B * H * Lq * Lk <= BIAS_TILE_CELLS


def flash_takes(q: Tensor, k: Tensor, v: Tensor, bias: Tensor) -> bool:
    """Whether a decode step may run the CPU flash kernel with the tile as its mask: one width and
    one head count for q, k and v, in float32 or float64 (half precision computes in float32 here),
    and no gradient asked of the tile (the kernel's backward gives none to its mask)."""
    same = q.shape[1] == k.shape[1] and q.shape[-1] == k.shape[-1] == v.shape[-1]
    plain = q.dtype == k.dtype == v.dtype == bias.dtype and q.dtype in (torch.float32, torch.float64)
    return same and plain and q.device.type == "cpu" and not (torch.is_grad_enabled() and bias.requires_grad)


def sdpa_bias_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    prior: Prior,
    masking: Masking,
    scale: float,
    ssmax: Scaling | None,
) -> Tensor:
    """A decode step: logits ``scale <q, k> + K`` with the prior's log-prior tile ``(B, H, Lq, Lk)``.

    With few queries the tile is smaller than the keys: folding would rebuild ``[k, k_lanes]`` (and
    pad ``v``) for every cached key at every step, an O(Lk D) copy as costly as the attention itself,
    while the tile is O(H Lk). Any prior fits, folding or not, and the tile is the reference's own
    ``log_prior``; on run positions (a generation's) ``log_prior_of_runs``, which priors with
    position tables answer with a view of them, so building the tile costs nothing per key. The
    products are taken directly rather than through SDPA: its CPU kernel would
    fall back to its slower math path whenever q/k and v differ in width, as a folding prior's
    content lanes do. Hidden keys take the lowest finite logit and get zero weight, so rows that see
    no key (or only keys with a -inf log-prior) return zeros, as on the reference route.
    """
    Lq, Lk = q.shape[2], k.shape[2]
    dtype = compute_dtype(q.dtype)
    if masking.starts is None:
        bias = prior.log_prior(masking.q_pos, masking.k_pos).to(dtype)  # (B or 1, H, Lq, Lk)
    else:  # positions are runs (a generation's): the prior's tables give views, no work per key
        bias = prior.log_prior_of_runs(masking.q_start, Lq, masking.k_start, Lk, q.device, dtype)
    # The usual step, one newest query under a plain causal mask, sees every key: nothing to hide.
    visible = None if masking.plain_causal and Lq == 1 else masking.visible()  # (B or 1, 1, Lq, Lk)
    q = q.to(dtype) * scale
    if ssmax is not None:
        counts = torch.full((1, 1), Lk) if visible is None else visible.sum(-1)[:, 0]
        factor = ssmax.factor(counts.to(q.device)).to(dtype)  # (B or 1, H, Lq, 1)
        q = q * factor
        if ssmax.scale_prior:
            bias = bias * factor
    if visible is None and flash_takes(q, k, v, bias):
        # Heads and widths agree (a prior that does not fold, as GGD): the CPU flash kernel takes the
        # tile as its additive mask and reads k and v once, without a separate softmax pass.
        B, H = q.shape[:2]
        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        return flash(q, k, v, 0.0, False, attn_mask=bias.expand(B, H, Lq, Lk), scale=1.0)[0]
    logits = grouped_scores(q, k.to(dtype)) + bias
    if visible is None:
        return grouped_values(torch.softmax(logits, dim=-1), v.to(dtype)).to(v.dtype)
    probs = torch.softmax(logits.masked_fill_(~visible, torch.finfo(dtype).min), dim=-1)
    probs = probs * visible  # as masked_softmax: a row with no visible or only -inf logits gets zeros
    return grouped_values(probs, v.to(dtype)).to(v.dtype)
