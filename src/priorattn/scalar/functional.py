"""``scalar_attention``: scalar Gaussian-kernel and hybrid attention (seed 002), validated once.

    logits[b, h, i, j] = scale <q_i, k_j>  -  (q_s[b, h, i] - k_s[b, h, j])^2 / tau  +  K_h(i, j)

with the dot product only in the hybrid (seed 002 "Hybrid Scalar + Dot-Product Attention") and the
log-prior ``K`` only when a prior is given (seed 002 experiment 6: GOAT + the scalar term). Two
routes: ``"reference"``, the dense definition (:mod:`.reference`), and every route of
:func:`priorattn.attention` (``"auto"``, ``"sdpa"``, ``"memeff"``, ...), which receive the scalar
term folded into q/k lanes (:mod:`.fold`) next to the content and the prior's own lanes, so the
whole score runs as one unmodified SDPA call and no ``Lq x Lk`` matrix is built.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..checks import check_key_padding_mask, check_positions, describe, value_checks_enabled
from ..functional import BACKENDS, attention
from ..functional.api import _doc_ids, check_options
from ..functional.masks import Masking
from ..functional.reference import compute_dtype
from ..priors import Prior, Uniform
from .fold import key_lanes, query_lanes
from .reference import Sink, scalar_reference, scalar_weights


def scalar_attention(
    q_s: Tensor,
    k_s: Tensor,
    v: Tensor,
    tau: Tensor | float,
    *,
    q: Tensor | None = None,
    k: Tensor | None = None,
    scale: float | None = None,
    prior: Prior | None = None,
    causal: bool = True,
    q_pos: Tensor | None = None,
    k_pos: Tensor | None = None,
    doc_ids: Tensor | tuple[Tensor, Tensor] | None = None,
    key_padding_mask: Tensor | None = None,
    window: int | None = None,
    sink_value: Tensor | None = None,
    sink_key: float = 0.0,
    backend: str = "auto",
) -> Tensor:
    """Scalar (or hybrid) attention ``softmax_j(scale <q_i, k_j> - (q_s,i - k_s,j)^2 / tau) v``.

    Args:
        q_s: scalar queries ``(B, H, Lq)``. k_s: scalar keys ``(B, H, Lk)``, one per head (seed 002:
            "one float per token per head").
        v: values ``(B, G, Lk, Dv)``: ``G`` value groups, ``H % G == 0``; head ``h`` reads group
            ``h // (H / G)`` (seed 002 "Grouped Value Attention").
        tau: bandwidth ``> 0``: a number or a tensor ``()`` (global), ``(H,)`` (per head) or
            ``(B, H, Lq)`` (per query token, data dependent).
        q, k: the hybrid's vector queries ``(B, H, Lq, Dk)`` and keys ``(B, G, Lk, Dk)``; both or
            neither (pure scalar attention). scale: their dot-product scale, default ``1/sqrt(Dk)``.
        prior: a log-prior added unscaled, as in :func:`priorattn.attention`.
        causal, q_pos, k_pos, doc_ids, key_padding_mask, window: the masks of
            :func:`priorattn.attention`, same meaning.
        sink_value: ``(G, Dv)``: a sink key (seed 002 "Attention Sinks"), visible to every query,
            with scalar key ``sink_key``, a zero vector key in the hybrid, and this value. It has no
            position, so it takes no prior and no ``window``.
        backend: ``"reference"`` (the dense definition) or a route of :func:`priorattn.attention`.

    Returns:
        ``(B, H, Lq, Dv)``; a query that sees no key (and no sink) returns zeros.
    """
    masks = (causal, q_pos, k_pos, doc_ids, key_padding_mask, window)
    call = _check_call(q_s, k_s, v, tau, q, k, scale, prior, masks, sink_value, sink_key, backend)
    tau, hybrid, scale, prior, sink, masking = call
    G = v.shape[1]
    if backend == "reference":
        return scalar_reference(q_s, k_s, v, tau, q, k, scale, prior, masking, sink)
    dtype = compute_dtype(v.dtype)  # the expanded square cancels in the logits: float32 at least
    q2, k2 = query_lanes(q_s.to(dtype), tau.to(dtype), G), key_lanes(k_s.to(dtype), G)
    if hybrid:
        q2, k2 = torch.cat([scale * q.to(dtype), q2], dim=-1), torch.cat([k.to(dtype), k2], dim=-1)
    v2 = v.to(dtype)
    if sink is not None:
        q2, k2, v2, masking = _prepend_sinks(q2, k2, v2, sink, masking)
    # SDPA's flash kernel wants one head width for q, k and v; narrower q/k (pure scalar heads have
    # 2m lanes) would send it to the math path, which builds the Lq x Lk weights: zero lanes widen them.
    folds = prior is None or prior.can_fold(causal)
    short = v2.shape[-1] - (0 if prior is None else prior.fold_width if folds else 0) - q2.shape[-1]
    if short > 0 and folds and backend in ("auto", "sdpa"):
        q2, k2 = F.pad(q2, (0, short)), F.pad(k2, (0, short))
    out = attention(
        q2,
        k2,
        v2,
        prior=prior,
        scale=1.0,
        causal=masking.causal,
        q_pos=masking.q_pos,
        k_pos=masking.k_pos,
        doc_ids=None if masking.q_doc is None else (masking.q_doc, masking.k_doc),
        key_padding_mask=masking.key_padding,
        window=masking.window,
        backend=backend,
    )
    return out.to(v.dtype)


def scalar_attention_weights(
    q_s: Tensor,
    k_s: Tensor,
    v: Tensor,
    tau: Tensor | float,
    *,
    q: Tensor | None = None,
    k: Tensor | None = None,
    scale: float | None = None,
    prior: Prior | None = None,
    causal: bool = True,
    q_pos: Tensor | None = None,
    k_pos: Tensor | None = None,
    doc_ids: Tensor | tuple[Tensor, Tensor] | None = None,
    key_padding_mask: Tensor | None = None,
    window: int | None = None,
    sink_value: Tensor | None = None,
    sink_key: float = 0.0,
    backend: str = "auto",
) -> Tensor:
    """The attention weights of the :func:`scalar_attention` call with the same arguments, from the
    dense definition: ``(B, H, Lq, Lk)`` in at least float32, or ``(B, H, Lq, 1 + Lk)`` with the
    sink's weight first when ``sink_value`` is given. For analysis (seed 002 experiments 2-5): it
    builds the ``Lq x Lk`` matrix, whatever ``backend`` says (checked all the same)."""
    masks = (causal, q_pos, k_pos, doc_ids, key_padding_mask, window)
    call = _check_call(q_s, k_s, v, tau, q, k, scale, prior, masks, sink_value, sink_key, backend)
    tau, _, scale, prior, sink, masking = call
    return scalar_weights(q_s, k_s, tau, q, k, scale, prior, masking, sink, compute_dtype(v.dtype))


def _check_call(q_s, k_s, v, tau, q, k, scale, prior, masks: tuple, sink_value, sink_key, backend):
    """The checked inputs of a call: ``(tau, hybrid, scale, prior, sink, masking)``, with a uniform
    prior dropped (it adds a constant) and the default scale resolved. ``masks``: ``(causal, q_pos,
    k_pos, doc_ids, key_padding_mask, window)``."""
    causal, q_pos, k_pos, doc_ids, key_padding_mask, window = masks
    B, H, Lq, G, Lk = _check_scalar_inputs(q_s, k_s, v)
    tau = check_tau(tau, B, H, Lq, v.dtype)
    hybrid = _check_content(q, k, B, H, Lq, G, Lk)
    check_options(prior, H, window, backend, heads=f"q_s has {H}")
    if prior is not None:
        prior.check_finite()
    if isinstance(prior, Uniform):
        prior = None
    sink = _check_sink(sink_value, sink_key, G, v, prior, window)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1]) if hybrid else 1.0
    masking = _masking(B, Lq, Lk, q_pos, k_pos, q_s.device, causal, doc_ids, key_padding_mask, window)
    return tau, hybrid, scale, prior, sink, masking


def check_tau(tau: Tensor | float, B: int, H: int, Lq: int, dtype: torch.dtype) -> Tensor:
    """``tau`` as a tensor broadcastable to ``(B, H, Lq)``; every entry finite and ``> 0``."""
    if not isinstance(tau, Tensor):
        if isinstance(tau, bool) or not isinstance(tau, (int, float)):
            raise ValueError(f"tau must be a number or a tensor, got {describe(tau)}")
        if not (math.isfinite(tau) and tau > 0):
            raise ValueError(f"tau must be finite and > 0 (a bandwidth), got {tau!r}")
        tau = torch.tensor(float(tau), dtype=dtype)
    if tau.shape == ():
        tau = tau.view(1, 1, 1)
    elif tau.shape == (H,):
        tau = tau.view(1, H, 1)
    elif tau.shape != (B, H, Lq):
        raise ValueError(f"tau must have shape (), ({H},) or ({B}, {H}, {Lq}), got {tuple(tau.shape)}")
    if not tau.is_floating_point():
        raise ValueError(f"tau must be floating point, got {tau.dtype}")
    # A tensor's values are read only when asked (priorattn.set_value_checks): each read is a host
    # sync; Temperature's tau is positive by construction.
    if value_checks_enabled() and not bool(((tau > 0) & torch.isfinite(tau)).all()):
        raise ValueError(f"tau must be finite and > 0 (a bandwidth), got min {float(tau.min()):g}")
    return tau


def _check_scalar_inputs(q_s: Tensor, k_s: Tensor, v: Tensor) -> tuple[int, int, int, int, int]:
    expected = (("q_s", q_s, 3, "(B, H, Lq)"), ("k_s", k_s, 3, "(B, H, Lk)"), ("v", v, 4, "(B, G, Lk, Dv)"))
    for name, t, ndim, dims in expected:
        if not isinstance(t, Tensor) or t.dim() != ndim:
            raise ValueError(f"{name} must be a tensor {dims}, got {describe(t)}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be floating point, got {t.dtype}")
    B, H, Lq = q_s.shape
    if k_s.shape[:2] != (B, H):
        raise ValueError(f"k_s {tuple(k_s.shape)} must have q_s's batch and heads ({B}, {H}, Lk)")
    G, Lk = v.shape[1], k_s.shape[2]
    if v.shape[0] != B or v.shape[2] != Lk:
        raise ValueError(f"v {tuple(v.shape)} must be (B, G, Lk, Dv) = ({B}, G, {Lk}, Dv)")
    if H % G:
        raise ValueError(f"v has {G} value groups but there are {H} heads: G must divide H")
    for name, t in (("q_s", q_s), ("k_s", k_s)):
        if value_checks_enabled() and not bool(torch.isfinite(t).all()):
            raise ValueError(f"{name} has non-finite values (NaN or inf): a scalar key or query is undefined")
    return B, H, Lq, G, Lk


def _check_content(q, k, B: int, H: int, Lq: int, G: int, Lk: int) -> bool:
    """Whether the call is hybrid: the vector q and k come together, shaped as documented."""
    if (q is None) != (k is None):
        raise ValueError("q and k come together (hybrid attention) or not at all (pure scalar attention)")
    if q is None:
        return False
    if not isinstance(q, Tensor) or q.dim() != 4 or q.shape[:3] != (B, H, Lq):
        raise ValueError(f"q must be (B, H, Lq, Dk) = ({B}, {H}, {Lq}, Dk), got {describe(q)}")
    if not isinstance(k, Tensor) or k.dim() != 4 or k.shape != (B, G, Lk, q.shape[-1]):
        raise ValueError(f"k must be (B, G, Lk, Dk) = ({B}, {G}, {Lk}, {q.shape[-1]}), got {describe(k)}")
    return True


def _check_sink(value: Tensor | None, key: float, G: int, v: Tensor, prior, window) -> Sink | None:
    if value is None:
        return None
    if not isinstance(value, Tensor) or value.shape != (G, v.shape[-1]):
        raise ValueError(f"sink_value must be a ({G}, {v.shape[-1]}) tensor (G, Dv), got {describe(value)}")
    if not math.isfinite(float(key)):
        raise ValueError(f"sink_key must be a finite number, got {key!r}")
    if prior is not None or window is not None:
        raise ValueError("a sink has no position: it takes no prior and no window (pass sink_value=None)")
    return Sink(float(key), value)


def _masking(B, Lq, Lk, q_pos, k_pos, device, causal, doc_ids, key_padding_mask, window) -> Masking:
    """The call's masks, checked and resolved as :func:`priorattn.attention` resolves them."""
    q_pos = _positions("q_pos", q_pos, B, Lq, torch.arange(Lk - Lq, Lk, device=device))
    k_pos = _positions("k_pos", k_pos, B, Lk, torch.arange(Lk, device=device))
    q_doc, k_doc = _doc_ids(doc_ids, B, Lq, Lk)
    padding = None if key_padding_mask is None else check_key_padding_mask(key_padding_mask, B, Lk)
    return Masking(causal, q_pos, k_pos, q_doc, k_doc, padding, window)


def _prepend_sinks(q2: Tensor, k2: Tensor, v: Tensor, sink: Sink, masking: Masking):
    """Folded inputs and masks with the sink prepended as keys that every query sees.

    The core's masks live on positions and documents, so the sink enters as one key per document
    present among a row's queries (with that document's id), at the row's earliest query position
    (no later than any query, so causal masking keeps it); a row's unused sink slots are padding.
    """
    B, H, Lq, _ = q2.shape
    G, Lk = k2.shape[1], k2.shape[2]
    if masking.q_doc is None:
        docs = [torch.zeros(1, dtype=torch.long, device=q2.device)] * B
    else:
        docs = [row.unique() for row in masking.q_doc]
    D = max(len(d) for d in docs)
    used = torch.tensor([len(d) for d in docs], device=q2.device)
    unused = torch.arange(D, device=q2.device)[None] >= used[:, None]  # (B, D)
    key = key_lanes(torch.full((B, H, D), sink.key, dtype=q2.dtype, device=q2.device), G)
    content = k2.shape[-1] - key.shape[-1]  # the hybrid's sink has a zero vector key
    sink_k = torch.cat([k2.new_zeros(B, G, D, content), key], dim=-1)
    sink_v = sink.value.to(v.dtype)[None, :, None, :].expand(B, G, D, v.shape[-1])
    padding = unused.new_zeros(B, Lk) if masking.key_padding is None else masking.key_padding
    k_doc = None
    if masking.q_doc is not None:
        sink_doc = torch.stack([torch.cat([d, d[:1].expand(D - len(d))]) for d in docs])  # (B, D)
        k_doc = torch.cat([sink_doc, masking.k_doc], dim=-1)
    first = masking.q_pos.min(dim=-1, keepdim=True).values.expand(-1, D)
    masking = Masking(
        masking.causal,
        masking.q_pos,
        torch.cat([first, masking.k_pos.expand(first.shape[0], Lk)], dim=-1),
        masking.q_doc,
        k_doc,
        torch.cat([unused, padding], dim=-1),
        masking.window,
    )
    return q2, torch.cat([sink_k, k2], dim=2), torch.cat([sink_v, v], dim=2), masking


def _positions(name: str, pos: Tensor | None, B: int, L: int, default: Tensor) -> Tensor:
    return default[None] if pos is None else check_positions(name, pos, B, L)


__all__ = ["BACKENDS", "check_tau", "scalar_attention", "scalar_attention_weights"]
