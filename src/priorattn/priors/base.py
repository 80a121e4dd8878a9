"""The contract every prior follows.

A prior is a small ``nn.Module`` that knows its log-prior ``K_h(i, j)`` over query and key positions.
Attention routes ask it for what they need:

- ``log_prior(q_pos, k_pos)``: the dense definition, ``(..., H, Lq, Lk)``. Every route is tested
  against it. ``log_prior_of_runs`` is the same on positions that are runs (a decode step's).
- ``fold(q_pos, k_pos)``: the log-prior in bilinear form, :class:`FoldLanes` (q/k lanes plus
  key-only terms and a key-linear slope), equal to it up to a per-query constant (softmax ignores
  those), so one unmodified SDPA call can apply it (seed 000 Eq. 17-24). Only priors with
  ``can_fold(causal)`` true implement it.
- ``is_relative``: whether the log-prior depends on ``q_pos - k_pos`` only, so a route may evaluate
  it once per lag.
- ``scaled_lag(...)``: a log-prior of ``a(i - j) r(i)`` (FIRE), sampled on a grid that routes
  interpolate; None for the others.
- ``spec()``: the prior as plain data (its registered name and options), from which
  :func:`~priorattn.priors.build_prior` builds it again (:mod:`priorattn.priors.registry`).

A prior never knows about routes, masks, caches or models.
"""

from __future__ import annotations

import contextlib
import functools
import math
import operator
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.amp.autocast_mode import is_autocast_available

from .math import pairwise_lags
from .registry import spec_of
from .score_mod import ScoreMod, ScoreTerms, check_gate_queries, score_mod_of, score_positions


class FoldLanes(NamedTuple):
    """A log-prior in bilinear form (seed 000 Eq. 17-21), up to per-query constants:

    ``K_h(i, j) = <q[..., h, i, :], k[..., 0, j, :]> + key_bias[..., h, j] + slope[h] * k_pos[j] + c_hi``

    - ``q`` ``(..., H, Lq, P)`` and ``k`` ``(..., 1, Lk, P)``: lanes; the key lanes are shared by
      every head, so grouped-query attention keeps its shared keys.
    - ``key_bias`` ``(..., H, Lk)`` or None: key-only terms (GOAT's sink ``u_h(j)``, Eq. 19).
    - ``slope`` ``(H,)`` or None: a key-linear term, ALiBi under a causal mask (Prop. F.6). Routes
      add it as ``slope * (k_pos - centre)`` with a centre near the queries, because ``slope * k_pos``
      grows with the position and would swamp the content score in floating point.
    """

    q: Tensor
    k: Tensor
    key_bias: Tensor | None = None
    slope: Tensor | None = None

    @property
    def width(self) -> int:
        """Lanes this fold adds to a q/k head in SDPA form (one each for key bias and slope)."""
        return self.q.shape[-1] + (self.key_bias is not None) + (self.slope is not None)


class ScaledLag(NamedTuple):
    """A log-prior of a scaled lag, ``K_h(i, j) = g_h(a(i - j) r(i))``, causal on positions >= 0,
    where the argument ``x = a(i - j) r(i)`` lies in ``[0, 1]`` (FIRE's normalised lag), with ``g_h``
    sampled on a uniform grid of ``[0, 1]``; routes interpolate between the grid's points:

    - ``lag_scale``: ``a`` at the call's lags ``(n,)``;
    - ``row_scale``: ``r`` at the query positions ``(Lq,)``;
    - ``grid``: ``g_h(m / cells)`` for ``m = 0 .. cells``, ``(H, cells + 1)``.
    """

    lag_scale: Tensor
    row_scale: Tensor
    grid: Tensor


class Prior(nn.Module):
    """Base class: a learnable log-prior over (query position, key position)."""

    #: Number of heads the prior has parameters for; ``None`` means the same for every head.
    num_heads: int | None = None

    def __new__(cls, *args, **kwargs):
        prior = super().__new__(cls)
        # The arguments it is made with, kept before __init__ runs: :meth:`spec` reads its options from these.
        prior.__dict__["made_with"] = (args, kwargs)
        return prior

    def spec(self) -> dict | list:
        """This prior as plain data: ``{"name": ..., option: value, ...}`` with every option of its
        registration valued as it was made (a list of its parts' specs for a sum), so that
        ``build_prior(prior.spec(), prior.num_heads)`` makes the same prior (its parameters then
        come from a checkpoint). A TypeError for a class that is not registered."""
        return spec_of(self)

    def log_prior(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """Dense log-prior ``(..., H, Lq, Lk)`` for integer positions ``(..., Lq)`` and ``(..., Lk)``."""
        raise NotImplementedError

    def log_prior_of_runs(
        self, q_start: int, Lq: int, k_start: int, Lk: int, device: torch.device, dtype: torch.dtype
    ) -> Tensor:
        """:meth:`log_prior` ``(H or 1, Lq, Lk)`` of positions ``q_start + arange(Lq)`` and
        ``k_start + arange(Lk)``, cast to ``dtype``. A decode step over a cache of run positions asks
        for this: priors whose terms sit in a :class:`PositionTable` return views of it instead of
        reading it per key."""
        q_pos = torch.arange(q_start, q_start + Lq, device=device)
        return self.log_prior(q_pos, torch.arange(k_start, k_start + Lk, device=device)).to(dtype)

    def query_gate(self, q: Tensor) -> Tensor | None:
        """A per-query factor ``(B, H, Lq, 1)`` of the log-prior from the content queries ``q``
        ``(B, H, Lq, Dk)`` (before any scale): the logits are ``scale <q_i, k_j> + g(q_i) K(i, j)``.
        None (the default) for 1: the log-prior alone. Every route multiplies query i's prior terms
        (its fold lanes, key terms, lag table or tile) by it; GOAT's query-norm gate is one."""
        return None

    @property
    def gated(self) -> bool:
        """Whether :meth:`query_gate` gives a factor (not None)."""
        return False

    @property
    def is_relative(self) -> bool:
        """Whether the log-prior depends on ``q_pos - k_pos`` only (a Toeplitz matrix per head)."""
        return False

    def constant_beyond(self) -> int | None:
        """A lag ``d0 >= 1`` from which on a relative prior is constant by construction, whatever its
        parameters: ``K_h(i, j) = K_h(d0)`` whenever ``i - j >= d0`` (the same function of them), or
        None. The ``memeff`` route then runs those cells of a long causal call as plain causal
        attention shifted by ``K_h(d0)`` per head (``functional/lag_flash.py``, ``FarRegion``); a
        wrong answer would make it wrong, so a prior that is not sure says None."""
        return None

    def can_fold(self, causal: bool) -> bool:
        """Whether :meth:`fold` is exact (up to per-query constants) under this masking."""
        return False

    def fold(self, q_pos: Tensor, k_pos: Tensor) -> FoldLanes:
        """Lanes to append to q and k; see :class:`FoldLanes`. Routes pass one tensor as ``q_pos`` and
        ``k_pos`` where queries and keys hold the same positions, so that a prior may compute what
        the two share once (``q_pos is k_pos``)."""
        raise TypeError(f"{type(self).__name__} cannot be folded into q/k lanes")

    def fold_slope(self) -> Tensor | None:
        """The ``slope`` of :meth:`fold` (``(H,)`` or None) alone: a route choosing how to run a fold
        needs only it, and the whole fold of a GOAT (phases, the sink MLP) costs hundreds of
        microseconds. Priors whose slope is a parameter or buffer return it directly."""
        return self._fold_at_origin().slope

    def slope_bound(self) -> float:
        """An upper bound on ``|fold_slope()|`` that reads no tensor: 0 for a fold without a slope.

        Where reading the slope would wait for an accelerator or break a compiled graph, routes size
        their runs of queries by this bound (``functional/prior_inputs.py``). A prior that cannot
        bound its slope answers inf: its folds then take one query per call there."""
        return 0.0 if self.fold_slope() is None else math.inf

    @property
    def fold_width(self) -> int | None:
        """Number of lanes the fold adds to each q/k head when it runs through SDPA; ``None`` for a
        prior that folds under no mask (``can_fold`` false, causal or not), so that asking never
        raises. Whether it folds under a given mask: :meth:`can_fold`."""
        if not (self.can_fold(True) or self.can_fold(False)):
            return None
        return self._fold_at_origin().width

    def _fold_at_origin(self) -> FoldLanes:
        """:meth:`fold` of one query and one key at position 0, on the prior's device."""
        tensors = module_tensors(self)
        origin = torch.zeros(1, dtype=torch.long, device=tensors[0].device if tensors else None)
        return self.fold(origin, origin)

    def lag_values(self, lags: Tensor) -> Tensor:
        """``K_h(d, 0)`` at lags ``d`` ``(n,)``, as ``(H or 1, n)``: for a relative prior, its value at
        each lag (a lag table)."""
        origin = torch.zeros(1, dtype=lags.dtype, device=lags.device)
        return self.log_prior(lags, origin).reshape(-1, lags.shape[0])

    @property
    def is_scaled_lag(self) -> bool:
        """Whether the log-prior is a function of a scaled lag (:meth:`scaled_lag`)."""
        return False

    def scaled_lag(self, lags: Tensor, q_pos: Tensor, cells: int) -> ScaledLag:
        """This log-prior as a function of a scaled lag (:class:`ScaledLag`) at ``lags`` ``(n,)`` and
        query positions ``q_pos`` ``(Lq,)``, sampled at ``cells + 1`` points; only priors with
        :attr:`is_scaled_lag` true implement it."""
        raise TypeError(f"{type(self).__name__} is not a function of a scaled lag")

    def score_terms(self, q_pos: Tensor, k_pos: Tensor, lags: Tensor) -> ScoreTerms:
        """This log-prior split as a FlexAttention ``score_mod`` reads it (:class:`ScoreTerms`), at
        positions ``q_pos`` ``(B or 1, Lq)`` and ``k_pos`` ``(B or 1, Lk)`` whose lags all lie in the
        run ``lags`` ``(n,)``: a relative prior by lag, any other dense. A prior with a relative part
        and a key-only part gives them apart (GOAT), so it needs no ``Lq x Lk`` values."""
        if self.is_relative:
            return ScoreTerms(by_lag=self.lag_values(lags))
        return ScoreTerms(dense=self.log_prior(q_pos, k_pos))

    def score_mod(self, q_pos: Tensor, k_pos: Tensor | None = None, *, q: Tensor | None = None) -> ScoreMod:
        """A FlexAttention ``score_mod`` that adds this prior to the attention logits, attention-gym
        style: ``score + g(q_i) K_h(q_pos[b, q_idx], k_pos[b, kv_idx])``, so that
        ``flex_attention(q, k, v, score_mod=prior.score_mod(pos), block_mask=...)`` computes
        ``priorattn.attention(q, k, v, prior=prior, q_pos=pos, k_pos=pos, ...)`` with the same masks.

        - ``q_pos``, ``k_pos``: integer positions of the queries and keys that FlexAttention's
          ``q_idx`` and ``kv_idx`` index, ``(L,)`` or ``(B, L)`` (``k_pos`` None: ``q_pos``,
          self-attention). Any integers: per-row offsets, positions restarting at each document.
        - ``q``: the content queries ``(B, H, Lq, D)`` (before any scale), for a prior whose query
          gate reads them (GOAT's ``gate=True``: ``g_h(q_i)``, :meth:`query_gate`); unused otherwise.

        The whole log-prior enters ``score_mod``: no lanes are taken from the head (unlike a folding
        prior in :class:`~priorattn.PriorMultiheadAttention`), and the prior is added unscaled
        (``flex_attention``'s ``scale`` applies to ``<q, k>`` only). What the score_mod holds
        (:meth:`score_terms`): a relative prior's value at every lag of the positions (``Lq + Lk - 1``
        for runs), GOAT's relative part by lag and its sink by key, a prior that is neither (FIRE)
        ``Lq x Lk`` values per head. Make it in each forward pass: it holds the terms of the
        parameters as they are now, with their graph, so on CUDA the prior's parameters get their
        gradients through ``flex_attention``'s backward. Reading the positions' range is a host read:
        make it outside a compiled region.

        Masks come from :func:`priorattn.functional.flex_mask_mod` (causal order, documents,
        padding, a window, on positions as ``priorattn.attention`` reads them)::

            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
            from priorattn.functional import flex_mask_mod
            from priorattn.priors import GOAT

            B, H, L, D = 2, 8, 4096, 64
            q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            prior = GOAT(H, 4).cuda()
            pos = torch.arange(L, device="cuda")
            mask = create_block_mask(flex_mask_mod(pos, causal=True), None, None, L, L, device="cuda")
            out = torch.compile(flex_attention)(q, k, v, score_mod=prior.score_mod(pos), block_mask=mask)
        """
        q_pos, k_pos = score_positions(q_pos, k_pos)
        gate = None
        if self.gated:
            if q is None:
                raise ValueError(
                    f"{type(self).__name__}'s query gate reads the content queries: give q (B, H, Lq, D)"
                )
            check_gate_queries(q, self.num_heads, q_pos)
            gate = self.query_gate(q)
        low = int(q_pos.min()) - int(k_pos.max())
        lags = torch.arange(low, int(q_pos.max()) - int(k_pos.min()) + 1, device=q_pos.device)
        terms = self.score_terms(q_pos, k_pos, lags)
        return score_mod_of(
            q_pos,
            k_pos,
            key_bias=terms.by_key,
            table=terms.by_lag,
            low=low,
            dense=terms.dense,
            row_factor=gate,
        )

    def check_finite(self) -> None:
        """Raise a ``ValueError`` naming the first parameter that holds NaN or inf."""
        for name, p in self.named_parameters():
            if not torch.isfinite(p).all():
                raise ValueError(f"{type(self).__name__}.{name} has non-finite values")


def in_own_dtype(device: torch.device) -> contextlib.AbstractContextManager:
    """A context computing a prior's terms in its parameters' dtype even under autocast.

    A prior evaluates O(L) terms per head, a small share of a step, so full precision costs little,
    while autocast would round them to bfloat16 before the route rounds its lanes again; and on the
    CPU bfloat16 products of such small, odd shapes are slower than float32 ones, not faster
    (docs/performance_log.md).
    """
    # "meta" has no autocast to turn off. A compiled graph runs on a real device, and dynamo before
    # torch 2.13 cannot trace the availability check (a graph break on CUDA, torch 2.11).
    if not torch.compiler.is_compiling() and not is_autocast_available(device.type):
        return contextlib.nullcontext()
    return torch.autocast(device.type, enabled=False)


class LagPrior(Prior):
    """A relative prior given by its value at each lag ``i - j`` (:meth:`of_lag`, ``(H, ...)``): a
    subclass sets ``self.by_lag = PositionTable(self, self.of_lag)``, and the dense log-prior and the
    runs' Toeplitz tiles are read from that table."""

    @property
    def is_relative(self) -> bool:
        return True

    def log_prior(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        return self.by_lag(pairwise_lags(q_pos, k_pos)).movedim(0, -3)  # (..., H, Lq, Lk)

    def log_prior_of_runs(
        self, q_start: int, Lq: int, k_start: int, Lk: int, device: torch.device, dtype: torch.dtype
    ) -> Tensor:
        return self.by_lag.toeplitz(q_start, Lq, k_start, Lk, device, dtype)

    def lag_values(self, lags: Tensor) -> Tensor:
        """The table at ``lags`` ``(n,)``, ``(H, n)``: no key at 0 to subtract."""
        return self.by_lag(lags)


def cat_lanes(lanes: list[Tensor]) -> Tensor:
    """``lanes`` side by side along the last dimension, broadcast over the others; a part's own
    lanes as a view where every other part has none (ALiBi's beside GOAT's)."""
    shape = torch.broadcast_shapes(*(t.shape[:-1] for t in lanes))
    wide = [t for t in lanes if t.shape[-1]]
    if len(wide) == 1:
        return wide[0].expand(*shape, wide[0].shape[-1])
    return torch.cat([t.expand(*shape, t.shape[-1]) for t in lanes], dim=-1)


def sum_of_present(terms: list[Tensor | None]) -> Tensor | None:
    """The sum of the terms that are not None (one alone as it is); None if none is."""
    present = [t for t in terms if t is not None]
    return functools.reduce(operator.add, present) if present else None


def concat_lanes(parts: list[FoldLanes]) -> FoldLanes:
    """The fold of a sum of folded priors: lanes concatenate, key biases and slopes add."""
    return FoldLanes(
        cat_lanes([p.q for p in parts]),
        cat_lanes([p.k for p in parts]),
        sum_of_present([p.key_bias for p in parts]),
        sum_of_present([p.slope for p in parts]),
    )


class PositionTable:
    """``f`` of one integer (a key position, or a lag ``i - j``) kept as a table ``f(0 .. n - 1)``.

    A decode step asks a prior for its terms at every cached key although one key is new and the
    parameters stay fixed while generating; these terms depend on positions only, so outside
    autograd they are read from the table and ``f`` runs once per new position (the table doubles
    when a position passes its end). It is rebuilt when a parameter or buffer of ``owner``
    changes, in place (an optimizer step) or replaced. ``f`` is evaluated as before under autograd,
    ``torch.compile``, off the CPU (reading the positions' range would wait for the device), at
    negative integers, and for a few far positions (a table reaching them would cost more than
    they do: it is built only up to twice the number of integers asked for).

    ``f`` maps integers ``(n,)`` to per-head values ``(H, n)``; a read returns ``(H, *x.shape)``.
    A :meth:`run` of consecutive integers, rising or falling, is a view of the table (a falling
    one of its reversed copy, and in another dtype of a cast copy, each made once per table): no
    work per integer at all.
    """

    def __init__(self, owner: nn.Module, f: Callable[[Tensor], Tensor]):
        self.owner, self.f = owner, f
        self.state: tuple | None = None  # what the table was computed from
        self.values: Tensor | None = None  # f(arange(n)), (H, n)
        self.copies: dict[tuple[torch.dtype, bool], Tensor] = {}  # (dtype, reversed) -> values cast, flipped

    def __call__(self, x: Tensor) -> Tensor:
        if not self._keeps(x.device) or x.numel() == 0 or int(x.min()) < 0:
            return self.evaluate(x)
        values = self._covering(int(x.max()) + 1, x.numel(), x.device)
        if values is None:
            return self.evaluate(x)
        # index_select: one gather per head, faster than advanced indexing ``values[:, x]``
        return values.index_select(1, x.flatten()).unflatten(-1, x.shape)

    def run(
        self, start: int, length: int, step: int, device: torch.device, dtype: torch.dtype | None = None
    ) -> Tensor:
        """``f(start), f(start + step), ...``: ``length`` integers, ``step`` 1 or -1, as ``(H, length)``
        in ``dtype`` (default ``f``'s)."""
        last = start + step * (length - 1)
        values = None
        if self._keeps(device) and length > 0 and min(start, last) >= 0:
            values = self._covering(max(start, last) + 1, length, device)
        if values is None:
            return self.evaluate(torch.arange(start, last + step, step, device=device)).to(dtype)
        dtype = values.dtype if dtype is None else dtype
        if (dtype, step == -1) not in self.copies:
            cast = values.to(dtype)
            self.copies[dtype, step == -1] = cast.flip(-1) if step == -1 else cast
        first = start if step == 1 else values.shape[-1] - 1 - start  # where f(start) sits in the copy
        return self.copies[dtype, step == -1][:, first : first + length]

    def toeplitz(
        self,
        q_start: int,
        Lq: int,
        k_start: int,
        Lk: int,
        device: torch.device,
        dtype: torch.dtype | None = None,
    ) -> Tensor:
        """``f(q_pos[i] - k_pos[j])`` ``(H, Lq, Lk)`` for runs ``q_pos = q_start + arange(Lq)`` and
        ``k_pos = k_start + arange(Lk)``: row ``i`` is a falling run of lags."""
        rows = [self.run(q_start + i - k_start, Lk, -1, device, dtype) for i in range(Lq)]
        return rows[0][:, None] if Lq == 1 else torch.stack(rows, dim=1)

    def evaluate(self, x: Tensor) -> Tensor:
        return self.f(x.flatten()).unflatten(-1, x.shape)

    @staticmethod
    def _keeps(device: torch.device) -> bool:
        """Whether a table may be kept: see the class docstring."""
        return not torch.is_grad_enabled() and not torch.compiler.is_compiling() and device.type == "cpu"

    def _covering(self, n: int, count: int, device: torch.device) -> Tensor | None:
        """The table, grown to hold ``f(0 .. n - 1)`` at least, or None when ``n`` is too far for
        ``count`` integers asked for."""
        self._drop_if_stale()
        if self.values is None or self.values.shape[-1] < n:
            if n > 2 * count:
                return None
            size = n if self.values is None else max(n, 2 * self.values.shape[-1])
            self.values, self.copies = self.f(torch.arange(size, device=device)), {}
        return self.values

    def _drop_if_stale(self) -> None:
        state = tuple((t.data_ptr(), t._version, t.dtype) for t in module_tensors(self.owner))
        if self.state != state:
            self.state, self.values, self.copies = state, None, {}


def module_tensors(module: nn.Module) -> list[Tensor]:
    """Every parameter and buffer of ``module`` and its submodules, read from their own dicts
    without the name bookkeeping of ``parameters()`` and ``buffers()``: a decode step pays this per
    table read (docs/performance_log.md)."""
    modules, tensors = [module], []
    for m in modules:
        modules.extend(sub for sub in m._modules.values() if sub is not None)
        tensors.extend(t for d in (m._parameters, m._buffers) for t in d.values() if t is not None)
    return tensors
