"""``priorattn.attention``: validate once at the boundary, then hand off to a route."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..checks import check_doc_ids, check_key_padding_mask, check_positions, describe, value_checks_enabled
from ..priors import Prior, Uniform
from ..ssmax import Scaling, SSMax
from .flex import flex_route, flex_trains_on, mask_mod_of
from .masks import Masking, values_are_free
from .memeff import memeff_attention
from .normalizers import Regularizer, regularizer
from .prior_inputs import (
    MIN_FOLD_SPAN,
    fold_dtype,
    key_bias_drift,
    key_rates,
    largest_slope,
    slope_precision,
    slope_span,
    tabulates,
)
from .reference import reference_attention
from .sdpa import is_decode_step, sdpa_attention, sdpa_bias_attention
from .triton_route import triton_attention, triton_preferred, triton_takes

ROUTES = {
    "reference": reference_attention,
    "sdpa": sdpa_attention,
    "memeff": memeff_attention,
    "flex": flex_route,
    "triton": triton_attention,
}
BACKENDS = ("auto", *ROUTES)
#: From this many keys on, ``auto`` takes the ``triton`` route on CUDA where it would take ``flex``:
#: where it overtook FlexAttention on a Hopper GPU (docs/benchmarks.md).
TRITON_MIN_KEYS = 16384
#: What ``auto`` picks for a prior in a decode step (:func:`~.sdpa.sdpa_bias_attention`); not a backend
#: of its own: explicit backends keep their algorithm whatever the shapes.
DECODE_ROUTE = "sdpa_bias"


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    prior: Prior | None = None,
    causal: bool = True,
    scale: float | None = None,
    q_pos: Tensor | None = None,
    k_pos: Tensor | None = None,
    doc_ids: Tensor | tuple[Tensor, Tensor] | None = None,
    key_padding_mask: Tensor | None = None,
    window: int | None = None,
    ssmax: Tensor | SSMax | None = None,
    backend: str = "auto",
    normalizer: str | float | Regularizer = "softmax",
    key_bias: Tensor | None = None,
) -> Tensor:
    """Attention with a log-prior: ``softmax_j(scale <q_i, k_j> + K_h(q_pos[i], k_pos[j]) + u[b, h, j])``.

    Args:
        q: ``(B, H, Lq, Dk)``. k: ``(B, Hkv, Lk, Dk)``. v: ``(B, Hkv, Lk, Dv)``; ``H % Hkv == 0``
            (grouped-query attention: query head h reads key/value head ``h // (H // Hkv)``).
        prior: a :class:`~priorattn.priors.Prior`; its log-prior is added unscaled (seed 000 Eq. 23).
            ``None`` or ``Uniform()`` is standard attention.
        causal: key j is visible to query i iff ``k_pos[j] <= q_pos[i]``.
        scale: content scale, default ``1 / sqrt(Dk)``.
        q_pos, k_pos: integer positions ``(L,)`` or ``(B, L)``; default ``k_pos = arange(Lk)`` and
            ``q_pos = arange(Lk - Lq, Lk)``, so queries are the newest keys (KV-cache decoding).
        doc_ids: ``(B, Lk)`` document ids of the keys (queries take the last ``Lq``), or a pair
            ``(q_doc_ids (B, Lq), k_doc_ids (B, Lk))``: attention stays inside a document.
        key_padding_mask: ``(B, Lk)`` bool, True marks a padding key to ignore.
        window: keep only keys with ``0 <= q_pos - k_pos < window`` (``|q_pos - k_pos| < window``
            when not causal): sliding-window attention.
        ssmax: per-head SSMax scales ``(H,)`` or an :class:`~priorattn.SSMax` module: logits of query
            i are multiplied by ``s_h log n_i``, ``n_i`` its number of visible keys. A bare tensor
            scales the prior too; use ``SSMax(..., scale_prior=False)`` to scale content only.
        backend: ``"reference"`` (dense definition), ``"sdpa"`` (prior folded into q/k lanes, one
            unmodified SDPA call), ``"memeff"`` (blockwise, any prior, O(L) memory), ``"flex"``
            (compiled FlexAttention; forward only on the CPU), ``"triton"`` (fused Triton kernels
            with the prior's terms and gradients inside: a prior that folds or is relative, on
            positions that are runs; CUDA, or the CPU under ``TRITON_INTERPRET=1``), or ``"auto"``
            (in a decode step, at
            most 16 queries against more keys, the prior's log-prior tile is added to the logits
            instead of folding every key: ``sdpa.sdpa_bias_attention``; on CUDA ``"flex"`` (or
            ``"triton"`` from 16384 keys on, where Triton is installed) for a
            prior that does not fold, when it is relative on position runs; ``"flex"`` never on
            the CPU, where it has no backward).
        normalizer: the map from logits to weights, ``argmin_p -<p, logits> + Omega(p)`` over the
            simplex (seed 004 Eq. 19): ``"softmax"``, ``"sparsemax"``, ``"entmax15"``, an entmax
            ``alpha > 1``, or a :class:`~priorattn.eot.Regularizer` without position terms. Only
            ``"reference"`` computes maps other than softmax; ``"auto"`` picks it for them.
        key_bias: ``u``, a per-key additive term ``(B, H, Lk)`` or broadcastable to it (``(Lk,)``,
            ``(H, Lk)``, ``(B, 1, Lk)``, ...), finite, any floating dtype, data-dependent and
            differentiable (FoX's ``-F_j``: :class:`~priorattn.layers.ForgetGate`). It is part of the
            log-prior: a bare SSMax tensor scales it too, and so does a prior's query gate (GOAT's:
            ``g(q_i) (K + u)``, one lane per key term). It is exact on every route: a fold lane on
            ``"sdpa"``, a tile term on ``"memeff"`` and in a decode step, a ``score_mod`` term on
            ``"flex"``, a kernel term on ``"triton"``. Routes add it re-centred on the keys each run
            of queries sees, in its own dtype (pass float64 for a term that drifts far, as FoX's
            cumulative sums do).

    Returns:
        ``(B, H, Lq, Dv)``. A query that sees no key at all returns zeros, never NaN.
    """
    B, H, Lq, Dk = _check_qkv(q, k, v)
    Lk = k.shape[2]
    check_options(prior, H, window, backend, heads=f"q has {H}")
    omega = check_normalizer(normalizer, backend)
    if prior is not None and value_checks_enabled():
        prior.check_finite()
    if isinstance(prior, Uniform):
        prior = None
    # Default positions are runs known without reading them back (see Masking.starts).
    starts = (Lk - Lq, 0) if q_pos is None and k_pos is None else None
    # One run serves both defaults: the queries' positions are its last Lq entries, the keys' its last Lk.
    run = torch.arange(min(0, Lk - Lq), Lk, device=q.device)
    q_pos = _positions("q_pos", q_pos, B, Lq, run[run.shape[0] - Lq :])
    k_pos = _positions("k_pos", k_pos, B, Lk, run[run.shape[0] - Lk :])
    q_doc, k_doc = _doc_ids(doc_ids, B, Lq, Lk)
    padding = None if key_padding_mask is None else check_key_padding_mask(key_padding_mask, B, Lk)
    masking = Masking(causal, q_pos, k_pos, q_doc, k_doc, padding, window, starts)
    scaling = _scaling(ssmax, H)
    scale = 1.0 / math.sqrt(Dk) if scale is None else float(scale)
    key_bias = None if key_bias is None else check_key_bias(key_bias, q, Lk)
    if not omega.is_softmax:
        return reference_attention(q, k, v, prior, masking, scale, scaling, key_bias, omega.normalize)
    if backend == "auto":
        backend = _choose(q, k, prior, masking, key_bias)
    route = sdpa_bias_attention if backend == DECODE_ROUTE else ROUTES[backend]
    return route(q, k, v, prior, masking, scale, scaling, key_bias)


def flex_mask_mod(
    q_pos: Tensor,
    k_pos: Tensor | None = None,
    *,
    causal: bool = True,
    doc_ids: Tensor | tuple[Tensor, Tensor] | None = None,
    key_padding_mask: Tensor | None = None,
    window: int | None = None,
):
    """FlexAttention's ``mask_mod(b, h, q_idx, kv_idx)`` for :func:`attention`'s masks: True where
    query ``q_idx`` of row ``b`` sees key ``kv_idx`` under ``causal``, ``doc_ids``,
    ``key_padding_mask`` and ``window`` as :func:`attention` reads them, on the positions ``q_pos``,
    ``k_pos`` (``(L,)`` or ``(B, L)``; ``k_pos`` None: ``q_pos``). With a prior's
    :meth:`~priorattn.priors.Prior.score_mod` it runs a priorattn prior in ``flex_attention``:
    ``create_block_mask(flex_mask_mod(pos, doc_ids=docs), B, None, L, L)``. Every query should see
    a key (FlexAttention returns zeros for one that sees none, as :func:`attention` does)."""
    k_pos = q_pos if k_pos is None else k_pos
    Lq, Lk = (pos.shape[-1] if isinstance(pos, Tensor) else 0 for pos in (q_pos, k_pos))
    rows = [t.shape[0] for t in (q_pos, k_pos) if isinstance(t, Tensor) and t.dim() == 2]
    for t in (doc_ids[1] if isinstance(doc_ids, tuple | list) else doc_ids, key_padding_mask):
        rows += [t.shape[0]] if isinstance(t, Tensor) and t.dim() == 2 else []
    B = max(rows, default=1)
    q_pos, k_pos = check_positions("q_pos", q_pos, B, Lq), check_positions("k_pos", k_pos, B, Lk)
    check_window(window)
    q_doc, k_doc = _doc_ids(doc_ids, B, Lq, Lk)
    padding = None if key_padding_mask is None else check_key_padding_mask(key_padding_mask, B, Lk)
    return mask_mod_of(Masking(causal, q_pos, k_pos, q_doc, k_doc, padding, window))


def check_options(prior: Prior | None, num_heads: int, window, backend: str, heads: str) -> None:
    """Checks shared by :func:`attention` and the layers that call it; ``heads`` says where
    ``num_heads`` came from, for the message."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if prior is not None and not isinstance(prior, Prior):
        raise TypeError(f"prior must be a priorattn.priors.Prior, got {type(prior).__name__}")
    if prior is not None and prior.num_heads is not None and prior.num_heads != num_heads:
        raise ValueError(f"prior has {prior.num_heads} heads but {heads}")
    check_window(window)


def check_window(window: object) -> None:
    if window is not None and (not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be a positive int, got {window!r}")


def check_normalizer(normalizer: str | float | Regularizer, backend: str) -> Regularizer:
    """The regularizer behind ``normalizer``; only the reference route computes maps other than softmax."""
    omega = regularizer(normalizer)
    if omega.depends_on_positions:
        raise ValueError(
            f"normalizer {omega!r} carries its own position terms: give the prior as prior= "
            "(seed 000 Prop. 3.1: softmax with a log-prior is the KL-regularized map)"
        )
    if not omega.is_softmax and backend not in ("auto", "reference"):
        raise ValueError(
            f"backend={backend!r} computes softmax only; normalizer {omega!r} needs "
            "backend='reference' (or 'auto', which picks it)"
        )
    return omega


def check_key_bias(key_bias: object, q: Tensor, Lk: int) -> Tensor:
    """``key_bias`` as ``(B or 1, H or 1, Lk)``: a floating tensor on ``q``'s device that broadcasts to
    ``(B, H, Lk)``, finite where value checks are on."""
    B, H = q.shape[:2]
    if not isinstance(key_bias, Tensor) or not key_bias.is_floating_point():
        raise TypeError(f"key_bias must be a floating point tensor, got {describe(key_bias)}")
    if key_bias.device != q.device:
        raise ValueError(f"key_bias is on {key_bias.device} but q is on {q.device}")
    shape = tuple(key_bias.shape)
    fits = len(shape) <= 3 and all(n in (1, m) for n, m in zip(shape[::-1], (Lk, H, B)))
    if not fits or shape[-1:] != (Lk,):
        raise ValueError(
            f"key_bias must broadcast to (B, H, Lk) = ({B}, {H}, {Lk}) with Lk keys, got {shape}"
        )
    if value_checks_enabled() and not torch.isfinite(key_bias).all():
        raise ValueError("key_bias has non-finite values (hide keys with key_padding_mask)")
    return key_bias.reshape((1,) * (3 - len(shape)) + shape)


def _choose(q: Tensor, k: Tensor, prior: Prior | None, masking: Masking, key_bias: Tensor | None) -> str:
    """Fastest exact route: a decode step's prior (and key bias) as SDPA's additive bias, else fold
    into SDPA where possible, else FlexAttention where it trains (CUDA) and can read the prior (a lag
    table), otherwise the blockwise route. On CUDA a fold whose slope would split the queries into
    runs (sized by the prior's bound, read from nothing), and a key bias, go to FlexAttention too:
    the ``sdpa`` route's runs cost tens of times flash SDPA there at long lengths (docs/benchmarks.md),
    and a key bias's runs are sized by a drift it must read, where ``score_mod`` adds ``-m (i - j)``
    and the key bias centred per row in one kernel. A slope that fits one run stays on ``sdpa``: one
    call of the flash kernel, where flex costs more at short lengths (tiny-model training).
    Where FlexAttention would run, the fused Triton kernels run instead from
    :data:`TRITON_MIN_KEYS` keys on (when Triton is installed and they compute the call:
    :func:`~.triton_route.triton_takes`); below it FlexAttention was faster (docs/benchmarks.md).
    A prior of a scaled lag (FIRE, causal), which neither SDPA nor FlexAttention runs, takes them at
    every length on CUDA, never the blockwise route."""
    if prior is None and key_bias is None:
        return "sdpa"
    if is_decode_step(q, k):
        return DECODE_ROUTE
    fused = triton_preferred(q.device) and k.shape[2] >= TRITON_MIN_KEYS and triton_takes(prior, masking)
    folds = prior is None or prior.can_fold(masking.causal)
    span = None  # the longest run of queries one SDPA call of the fold may take (None: all)
    if prior is not None and folds:
        rates = key_rates(prior.fold_slope(), key_bias_drift(key_bias))
        largest = largest_slope(rates, prior.slope_bound())
        compute = fold_dtype(largest, q.dtype, masking, key_bias)
        span = slope_span(largest, slope_precision(compute, masking, key_bias))
    runs = span is not None and span < q.shape[2]
    if flex_trains_on(q.device) and (folds or tabulates(prior, masking)) and (runs or key_bias is not None):
        return "triton" if fused else "flex"
    if prior is None:  # the key bias alone is one lane: shorter runs of queries still beat blocks
        return "sdpa"
    if folds:
        if span is None or span >= min(q.shape[2], MIN_FOLD_SPAN):
            return "sdpa"
    elif flex_trains_on(q.device) and tabulates(prior, masking):
        return "triton" if fused else "flex"
    if triton_preferred(q.device) and triton_takes(prior, masking):
        return "triton"  # FIRE, causal: the blockwise route's tiles are hundreds of times flash on CUDA
    return "memeff"


def _check_qkv(q: Tensor, k: Tensor, v: Tensor) -> tuple[int, int, int, int]:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.dim() != 4:
            shape = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a 4-D tensor (B, heads, L, D), got {shape}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be floating point, got {t.dtype}")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    B, H, Lq, Dk = q.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"batch sizes differ: q {B}, k {k.shape[0]}, v {v.shape[0]}")
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must agree on (B, Hkv, Lk)")
    if k.shape[3] != Dk:
        raise ValueError(f"q has head width {Dk} but k has {k.shape[3]}")
    if H % k.shape[1] != 0:
        raise ValueError(f"k has {k.shape[1]} heads but q has {H}: H must be a multiple of Hkv")
    return B, H, Lq, Dk


def _positions(name: str, pos: Tensor | None, B: int, L: int, default: Tensor) -> Tensor:
    """Positions as ``(B or 1, L)`` int64."""
    return default[None] if pos is None else check_positions(name, pos, B, L)


def _doc_ids(doc_ids, B: int, Lq: int, Lk: int) -> tuple[Tensor | None, Tensor | None]:
    if doc_ids is None:
        return None, None
    if isinstance(doc_ids, tuple | list) and len(doc_ids) == 2:  # (q_doc_ids, k_doc_ids)
        k_doc = check_doc_ids("doc_ids", doc_ids[1], B, Lk)
        q_doc = check_doc_ids("q doc_ids", doc_ids[0], B, Lq)
    else:
        k_doc = check_doc_ids("doc_ids", doc_ids, B, Lk)
        q_doc = k_doc[:, Lk - Lq :]
    if values_are_free(k_doc):
        first = k_doc[:, :1]  # (B, 1)
        if bool((k_doc == first).all()) and bool((q_doc == first).all()):
            return None, None  # one document per row masks nothing; dropping it keeps the mask-free kernels
    return q_doc, k_doc


def _scaling(ssmax: Tensor | SSMax | None, H: int) -> Scaling | None:
    if ssmax is None:
        return None
    scaling = ssmax.scaling() if isinstance(ssmax, SSMax) else Scaling(ssmax, True)
    if not isinstance(scaling.s, Tensor) or scaling.s.shape != (H,):
        shape = tuple(scaling.s.shape) if isinstance(scaling.s, Tensor) else scaling.s
        raise ValueError(f"ssmax must hold one scale per query head ({H},), got {shape}")
    if value_checks_enabled() and not torch.isfinite(scaling.s).all():
        raise ValueError("ssmax scales have non-finite values")
    return scaling
