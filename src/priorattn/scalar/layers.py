"""Scalar and hybrid self-attention layers with a KV cache, and layers mixing them with dot-product heads.

``ScalarMultiheadAttention`` is used like :class:`~priorattn.PriorMultiheadAttention`: ``y, cache =
layer(x, cache=cache)``. Its cache is a :class:`~priorattn.KVCache` whose keys hold, per value group,
the hybrid's vector key (if any) followed by the scalar keys of the group's ``m = H / G`` heads, so
it costs ``G n d_v + H n`` floats (+ ``G n d_k`` in the hybrid), seed 002 "Grouped Value Attention".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor, nn

from ..checks import describe
from ..encodings import RoPE
from ..layers import KVCache, PriorMultiheadAttention, layer_rope
from ..priors import Prior
from .functional import check_tau, scalar_attention, scalar_attention_weights
from .regularizers import align_from_moments, align_values, spread_loss, tau_loss
from .sorted_decoding import SortedLayerCache
from .temperature import Temperature, check_train_length, length_scaled_tau


class ScalarAttentionMap(NamedTuple):
    """A scalar layer's dense attention over a window (:meth:`ScalarMultiheadAttention.attention_map`):
    ``weights (B, H, Lq, Lk)`` over the window's keys, ``sink_weight (B, H, Lq)`` (None without a
    sink), and the scalar queries ``q_s (B, H, Lq)``, keys ``k_s (B, H, Lk)`` and ``tau (B, H, Lq)``."""

    weights: Tensor
    sink_weight: Tensor | None
    q_s: Tensor
    k_s: Tensor
    tau: Tensor

    def distance(self) -> Tensor:
        """``|q_s,i - k_s,j|``: ``(B, H, Lq, Lk)``."""
        return (self.q_s[..., :, None] - self.k_s[..., None, :]).abs()


class ScalarMultiheadAttention(nn.Module):
    """Self-attention with scalar queries/keys per head: ``softmax_j(-(q_s,i - k_s,j)^2 / tau) v_j``.

    Args:
        d_model: width of the input and output. num_heads: scalar query/key heads ``H``.
        value_groups: ``G`` value groups shared by ``H / G`` heads each (default ``H``).
        hybrid: add the dot product ``<q_i, k_j> / sqrt(head_dim)`` of per-head vector queries and
            per-group vector keys of width ``head_dim`` (seed 002 "Hybrid"); RoPE applies to them.
        tau, tau_init, tau_cap: the bandwidth's kind (``"global"``, ``"head"``, ``"token"``), start
            and optional cap (:class:`~priorattn.scalar.Temperature`).
        tau_length_scaling: ``None`` (default) or a length ``T``: a query that sees ``n > T`` keys
            (``n = position + 1``) uses ``tau (T / n)^2``
            (:func:`~priorattn.scalar.temperature.length_scaled_tau`), in training and after; the
            training length added at inference, or below it learned in training (a settable attribute).
        sink: a sink key with scalar key ``sink_key`` and a learned value per group, started at zero
            (a neutral value, seed 002 "Attention Sinks"); it takes no prior and no window.
        prior, encoding, causal, head_dim, window, backend: as in ``PriorMultiheadAttention``.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        value_groups: int | None = None,
        hybrid: bool = False,
        tau: str = "head",
        tau_init: float = 0.1,
        tau_cap: float | None = None,
        tau_length_scaling: int | None = None,
        sink: bool = False,
        sink_key: float = 0.0,
        prior: Prior | None = None,
        encoding: RoPE | Callable[[int], RoPE] | str | None = None,
        causal: bool = True,
        head_dim: int | None = None,
        window: int | None = None,
        backend: str = "auto",
    ):
        super().__init__()
        value_groups = num_heads if value_groups is None else value_groups
        head_dim = (
            d_model // num_heads
            if head_dim is None and isinstance(num_heads, int) and num_heads > 0
            else head_dim
        )
        for name, value in dict(
            d_model=d_model, num_heads=num_heads, value_groups=value_groups, head_dim=head_dim
        ).items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        check_train_length(tau_length_scaling)
        if num_heads % value_groups:
            raise ValueError(
                f"value_groups={value_groups} does not divide num_heads={num_heads}: each value group "
                "serves a whole number of scalar heads"
            )
        if sink and (prior is not None or window is not None):
            raise ValueError("a sink has no position: it takes no prior and no window (sink=False)")
        if encoding is not None and not hybrid:
            raise ValueError(
                "encoding rotates the hybrid's vector q/k: pure scalar heads have none (hybrid=False)"
            )
        self.d_model, self.num_heads, self.value_groups, self.head_dim = (
            d_model,
            num_heads,
            value_groups,
            head_dim,
        )
        self.content_dim = head_dim if hybrid else 0
        self.prior, self.causal, self.window, self.backend = prior, causal, window, backend
        self.ssmax = None  # seed 002 "Long Context Behavior": the kernel needs no length correction
        self.rope = layer_rope(encoding, head_dim) if hybrid else None
        self.temperature = Temperature(num_heads, tau, tau_init, tau_cap, d_model)
        self.tau_length_scaling = tau_length_scaling
        H, G, Dq = num_heads, value_groups, self.content_dim
        self.q_proj = nn.Linear(d_model, H * (Dq + 1), bias=False)  # per head: [q (Dq), q_s]
        self.k_proj = nn.Linear(d_model, G * Dq + H, bias=False)  # per group k (Dq), then H scalar keys
        self.v_proj = nn.Linear(d_model, G * head_dim, bias=False)
        self.out_proj = nn.Linear(H * head_dim, d_model, bias=False)
        self.sink_key = float(sink_key)
        self.sink_value = nn.Parameter(torch.zeros(G, head_dim)) if sink else None
        self.track: tuple[str, ...] = ()  # regularizer terms to compute (set by the training loop)
        self.spread_range: tuple[float, float] | None = (-3.0, 3.0)
        self.terms: dict[str, Tensor] = {}
        self.last_tau: Tensor | None = None  # tau of the latest training forward pass

    def cache_floats(self, n: int) -> int:
        """Floats a cache of ``n`` tokens holds per sequence: ``G n d_v + H n`` (+ ``G n d_k``)."""
        G = self.value_groups
        return G * n * self.head_dim + self.num_heads * n + G * n * self.content_dim

    def forward(
        self,
        x: Tensor,
        *,
        positions: Tensor | None = None,
        doc_ids: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> tuple[Tensor, KVCache]:
        """Attend ``x: (B, L, d_model)`` to itself and ``cache``; return ``(y, cache)`` (as
        ``PriorMultiheadAttention.forward``; cached and full passes give the same outputs)."""
        B, L = self._check_input(x, cache)
        if isinstance(cache, SortedLayerCache):
            if doc_ids is not None or key_padding_mask is not None:
                raise ValueError(
                    "a sorted cache holds one unpadded sequence: pass no doc_ids nor key_padding_mask"
                )
            positions = PriorMultiheadAttention._positions(positions, B, L, len(cache), x.device)
            return self._decode_sorted(x, positions, cache)
        q_s, k_s, tau, call, content, cache = self._call_inputs(
            x, positions, doc_ids, key_padding_mask, cache
        )
        y = scalar_attention(q_s, k_s, cache.v, tau, sink_value=self.sink_value, **call, **content)
        if self.training:
            self.last_tau = tau.detach()  # what the training loop logs (Regularizer.logged)
            if self.track:
                self.terms = self._regularizers(q_s, k_s, tau, content, call)
        return self.out_proj(y.transpose(1, 2).reshape(B, L, self.num_heads * self.head_dim)), cache

    @torch.no_grad()
    def attention_map(
        self, x: Tensor, *, positions: Tensor | None = None, doc_ids: Tensor | None = None
    ) -> ScalarAttentionMap:
        """The dense attention weights of this layer's heads over ``x: (B, L, d_model)`` (no cache),
        with the scalar queries, keys and tau they came from: what seed 002's experiments measure."""
        self._check_input(x, None)
        q_s, k_s, tau, call, content, cache = self._call_inputs(x, positions, doc_ids, None, None)
        weights = scalar_attention_weights(
            q_s, k_s, cache.v, tau, sink_value=self.sink_value, **call, **content
        )
        sink_weight = None
        if self.sink_value is not None:
            sink_weight, weights = weights[..., 0], weights[..., 1:]
        tau = check_tau(tau, *q_s.shape, q_s.dtype).expand_as(q_s)  # (B, H, L) whatever its kind
        return ScalarAttentionMap(weights, sink_weight, q_s, k_s, tau)

    def _call_inputs(self, x, positions, doc_ids, key_padding_mask, cache):
        """``(q_s, k_s, tau, call, content, cache)``: the scalar queries ``(B, H, L)``, the cached
        scalar keys ``(B, H, Lc)`` and tau of ``x``, the masks and prior of the attention call, the
        hybrid's vector ``q`` and cached ``k`` (``content``, empty for pure scalar heads), and the
        cache extended by ``x``."""
        B, L, _ = x.shape
        positions = PriorMultiheadAttention._positions(
            positions, B, L, 0 if cache is None else len(cache), x.device
        )
        H, Dq = self.num_heads, self.content_dim
        q, q_s, k, k_s, v = self.project(x, positions)
        new = KVCache(torch.cat([k, k_s], dim=-1), v, positions, doc_ids, key_padding_mask)
        cache = new if cache is None else cache.extend(new)
        Lc = len(cache)
        cached_k_s = cache.k[..., Dq:].transpose(2, 3).reshape(B, H, Lc)  # (B, H, Lc)
        call = dict(
            prior=self.prior,
            causal=self.causal,
            q_pos=positions,
            k_pos=cache.positions,
            doc_ids=None if doc_ids is None else (doc_ids, cache.doc_ids),
            key_padding_mask=cache.key_padding_mask,
            window=self.window,
            sink_key=self.sink_key,
            backend=self.backend,
        )
        content = dict(q=q, k=cache.k[..., :Dq]) if Dq else {}
        return q_s, cached_k_s, self.tau(x, positions), call, content, cache

    def tau(self, x: Tensor, positions: Tensor) -> Tensor:
        """The bandwidth of the queries of ``x (B, L, d_model)`` at ``positions (B or 1, L)``: the
        :class:`Temperature`'s, or with ``tau_length_scaling`` its length-scaled ``(B, H, L)``."""
        tau = self.temperature(x)
        if self.tau_length_scaling is None:
            return tau
        check_train_length(self.tau_length_scaling)
        B, L, _ = x.shape
        return length_scaled_tau(tau, positions, self.tau_length_scaling).expand(B, self.num_heads, L)

    def project(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """The projections of ``x: (B, L, d_model)``: ``q (B, H, L, Dq)``, ``q_s (B, H, L)``, ``k (B, G,
        L, Dq)``, ``k_s (B, G, L, m)`` (the scalar keys of each group's ``m = H / G`` heads, as the
        cache holds them) and ``v (B, G, L, D)``; ``Dq = 0`` unless hybrid, whose q and k are rotated
        by RoPE at ``positions`` if the layer has it."""
        B, L, _ = x.shape
        H, G, Dq, m = self.num_heads, self.value_groups, self.content_dim, self.num_heads // self.value_groups
        queries = self.q_proj(x).view(B, L, H, Dq + 1).transpose(1, 2)  # (B, H, L, Dq + 1)
        keys = self.k_proj(x)
        k = keys[..., : G * Dq].view(B, L, G, Dq).transpose(1, 2)  # (B, G, L, Dq)
        k_s = keys[..., G * Dq :].view(B, L, G, m).transpose(1, 2)  # (B, G, L, m): the group's heads
        q, q_s = queries[..., :Dq], queries[..., Dq]  # (B, H, L, Dq), (B, H, L)
        v = self.v_proj(x).view(B, L, G, self.head_dim).transpose(1, 2)  # (B, G, L, D)
        if self.rope is not None:
            q, k = self.rope(q, positions), self.rope(k, positions)
        return q, q_s, k, k_s, v

    def _decode_sorted(
        self, x: Tensor, positions: Tensor, cache: SortedLayerCache
    ) -> tuple[Tensor, SortedLayerCache]:
        """Feed ``x (1, L, d_model)`` token by token through a sorted cache (seed 002 "Binary Search
        at Inference"): each token is appended, then its query attends over its ``window`` nearest
        scalar keys per head."""
        _, L, _ = x.shape
        H, Dq = self.num_heads, self.content_dim
        q, q_s, k, k_s, v = self.project(x, positions)
        tau = self.tau(x, positions)  # (), (H,) or (1, H, L)
        outputs = []
        for i in range(L):
            step = cache.step(
                k_s[0, :, i].reshape(H),  # groups' heads in order: head g m + r
                v[0, :, i],
                q_s[0, :, i],
                tau[0, :, i] if tau.dim() == 3 else tau,
                k_vec=k[0, :, i] if Dq else None,
                q_vec=q[0, :, i] if Dq else None,
            )
            outputs.append(step)  # (H, D)
        y = torch.stack(outputs).reshape(1, L, H * self.head_dim)
        return self.out_proj(y.to(x.dtype)), cache

    def _regularizers(self, q_s: Tensor, k_s: Tensor, tau: Tensor, content: dict, call: dict) -> dict:
        """The unweighted seed 002 terms named in ``self.track`` for this forward pass."""
        terms = {}
        if "align" in self.track:
            terms["align"] = self._align(q_s, k_s, tau, content, call)
        if "spread" in self.track:
            terms["spread"] = spread_loss(k_s, self.spread_range)
        if "tau" in self.track:
            terms["tau"] = tau_loss(tau.expand(self.num_heads) if tau.dim() == 0 else tau)
        return terms

    def _align(self, q_s: Tensor, k_s: Tensor, tau: Tensor, content: dict, call: dict) -> Tensor:
        """``L_align`` through one more attention call over :func:`align_values`, whose score inputs
        (and the prior's parameters) are detached: the stop-gradient on the weights, seed 002 Term 1."""
        G = self.value_groups
        values = align_values(k_s, G)
        sink = None
        if self.sink_value is not None:  # the sink is a key too: its distance counts
            sink = align_values(torch.full_like(k_s[..., :1], self.sink_key), G)[0, :, 0]
        detached = {name: t.detach() for name, t in content.items()}
        frozen = {} if self.prior is None else {n: p.detach() for n, p in self.prior.named_parameters()}
        moments = torch.func.functional_call(
            _AlignCall(self.prior),
            {f"prior.{n}": p for n, p in frozen.items()},
            (q_s.detach(), k_s.detach(), values, tau.detach(), sink),
            dict(call, **detached),
        )
        return align_from_moments(q_s, moments)

    def _check_input(self, x, cache) -> tuple[int, int]:
        if not isinstance(x, Tensor) or x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be a tensor (B, L, d_model={self.d_model}), got {describe(x)}")
        B, L, _ = x.shape
        if cache is not None:
            if isinstance(cache, SortedLayerCache):
                cache.check_layer(self, B)
                return B, L
            if not isinstance(cache, KVCache):
                raise TypeError(f"cache must be a KVCache or a SortedLayerCache, got {type(cache).__name__}")
            m = self.num_heads // self.value_groups
            expected = (B, self.value_groups, len(cache), self.content_dim + m)
            if tuple(cache.k.shape) != expected:
                raise ValueError(
                    f"cache keys are {tuple(cache.k.shape)}, expected (B, G, Lc, d_k + H/G) = {expected}"
                )
        return B, L

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, num_heads={self.num_heads}, value_groups={self.value_groups}, "
            f"head_dim={self.head_dim}, hybrid={bool(self.content_dim)}, sink={self.sink_value is not None}, "
            f"causal={self.causal}, window={self.window}, backend={self.backend!r}, "
            f"tau_length_scaling={self.tau_length_scaling}"
        )


class _AlignCall(nn.Module):
    """``scalar_attention`` as a forward pass, so ``torch.func.functional_call`` can run it with the
    prior's parameters detached (the align statistics must not move the prior)."""

    def __init__(self, prior: Prior | None):
        super().__init__()
        self.prior = prior

    def forward(self, q_s, k_s, values, tau, sink, **call):
        call["prior"] = self.prior
        return scalar_attention(q_s, k_s, values, tau, sink_value=sink, **call)


@dataclass
class MixedCache:
    """The caches of a :class:`MixedMultiheadAttention`: its dot-product and its scalar heads."""

    dot: KVCache
    scalar: KVCache

    def __len__(self) -> int:
        return len(self.dot)


class MixedMultiheadAttention(nn.Module):
    """Some heads dot-product, some scalar (seed 002 "Hybrid Architecture"): ``num_heads -
    scalar_heads`` heads of a ``PriorMultiheadAttention`` (with ``prior`` and ``encoding``) and
    ``scalar_heads`` heads of a ``ScalarMultiheadAttention`` (with ``scalar_options``), all of width
    ``head_dim``. Their outputs add, which is one output projection over the concatenated heads."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        scalar_heads: int,
        *,
        prior: Prior | None = None,
        encoding: RoPE | Callable[[int], RoPE] | str | None = None,
        causal: bool = True,
        head_dim: int | None = None,
        window: int | None = None,
        backend: str = "auto",
        **scalar_options,
    ):
        super().__init__()
        if not isinstance(scalar_heads, int) or not 0 < scalar_heads < num_heads:
            raise ValueError(
                f"scalar_heads must be an int in [1, num_heads - 1] = [1, {num_heads - 1}] (some heads of "
                f"each kind), got {scalar_heads!r}"
            )
        head_dim = d_model // num_heads if head_dim is None else head_dim
        shared = dict(causal=causal, head_dim=head_dim, window=window, backend=backend)
        self.dot = PriorMultiheadAttention(
            d_model, num_heads - scalar_heads, prior=prior, encoding=encoding, **shared
        )
        self.scalar = ScalarMultiheadAttention(d_model, scalar_heads, **shared, **scalar_options)
        self.prior, self.ssmax = self.dot.prior, None  # what GPT.prior_parameters reads

    def forward(self, x: Tensor, *, cache: MixedCache | None = None, **masks) -> tuple[Tensor, MixedCache]:
        """``y, cache`` as ``PriorMultiheadAttention.forward`` (same keyword arguments)."""
        if cache is not None and not isinstance(cache, MixedCache):
            raise TypeError(f"cache must be a MixedCache, got {type(cache).__name__}")
        y_dot, dot = self.dot(x, cache=None if cache is None else cache.dot, **masks)
        y_scalar, scalar = self.scalar(x, cache=None if cache is None else cache.scalar, **masks)
        return y_dot + y_scalar, MixedCache(dot, scalar)


__all__ = ["MixedCache", "MixedMultiheadAttention", "ScalarAttentionMap", "ScalarMultiheadAttention"]
