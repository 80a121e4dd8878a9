"""A trained GPT's scalar layers kept as their inputs, for measurements on long windows.

:func:`~.common.attention_maps` builds every layer's whole ``L x L`` weights: at 4096 tokens that
is 67M floats per head. :func:`capture_scalar_layers` instead keeps what each layer's attention call
receives (scalar queries and keys, tau, the hybrid's vector queries and keys, the values, the masks)
in float64, and :meth:`ScalarLayerCapture.weights` gives the exact weights of any block of query
rows (:func:`~priorattn.scalar.functional.scalar_attention_weights`), with the sink's apart. The
values also let experiment 4 fill a sorted cache with the very tokens the model attends over.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ...functional.grouped import grouped_values
from ...functional.masks import Masking
from ...scalar.functional import check_tau, scalar_attention_weights
from ...scalar.layers import ScalarMultiheadAttention
from .common import scalar_layer_inputs


@dataclass
class ScalarLayerCapture:
    """One scalar layer on a batch of windows, in float64: ``q_s, k_s, tau (B, H, L)``, hybrid ``q
    (B, H, L, Dq)`` and ``k (B, G, L, Dq)`` (``None`` for pure scalar heads), ``v (B, G, L, D)``, and
    ``call``: the masks and prior of the layer's attention call (positions ``(B or 1, L)``)."""

    layer: ScalarMultiheadAttention
    q_s: Tensor
    k_s: Tensor
    tau: Tensor
    q: Tensor | None
    k: Tensor | None
    v: Tensor
    call: dict

    @property
    def length(self) -> int:
        return self.q_s.shape[-1]

    def weights(self, rows: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Exact attention weights of the query ``rows`` (default all): ``(B, H, R, L)`` over the
        keys (zero where masked) and the sink's ``(B, H, R)`` (``None`` without a sink)."""
        rows = torch.arange(self.length) if rows is None else rows
        call = dict(self.call, q_pos=self.call["q_pos"][:, rows])
        content = {} if self.q is None else dict(q=self.q[:, :, rows], k=self.k)
        sink_value = self.layer.sink_value
        weights = scalar_attention_weights(
            self.q_s[..., rows],
            self.k_s,
            self.v,
            self.tau[..., rows],
            sink_value=None if sink_value is None else sink_value.double(),
            **call,
            **content,
        )
        if sink_value is None:
            return weights, None
        return weights[..., 1:], weights[..., 0]

    def output(self, weights: Tensor, sink_weight: Tensor | None) -> Tensor:
        """The attention output ``(B, H, R, D)`` of weights as :meth:`weights` returns them."""
        out = grouped_values(weights, self.v)
        if sink_weight is not None:
            per_head = self.layer.sink_value.double().repeat_interleave(
                self.q_s.shape[1] // self.v.shape[1], 0
            )
            out = out + sink_weight[..., None] * per_head[:, None, :]
        return out

    def distances(self, rows: Tensor | None = None) -> Tensor:
        """``|q_s,i - k_s,j|`` of the query ``rows`` against every key, ``(B, H, R, L)``, with ``inf``
        for keys the query does not see (later positions, or outside the layer's window)."""
        rows = torch.arange(self.length) if rows is None else rows
        q_pos, k_pos = self.call["q_pos"][:, rows], self.call["k_pos"]
        visible = Masking(self.call["causal"], q_pos, k_pos, window=self.call["window"]).visible()
        distance = (self.q_s[..., rows, None] - self.k_s[..., None, :]).abs()
        return distance.masked_fill(~visible, torch.inf)


@torch.no_grad()
def capture_scalar_layers(model, tokens: Tensor) -> list[ScalarLayerCapture]:
    """Run ``model`` (a GPT, put in eval mode) on ``tokens (B, L)`` and capture every scalar layer,
    first block first."""
    captures = []
    for layer, x, positions in scalar_layer_inputs(model, tokens):
        q_s, k_s, tau, call, content, cache = layer._call_inputs(x, positions, None, None, None)
        tau = check_tau(tau, *q_s.shape, q_s.dtype).expand_as(q_s)  # (B, H, L) whatever its kind
        q, k = (content["q"].double(), content["k"].double()) if content else (None, None)
        captures.append(
            ScalarLayerCapture(layer, q_s.double(), k_s.double(), tau.double(), q, k, cache.v.double(), call)
        )
    return captures


def nearest_mass(weights: Tensor, distances: Tensor, k: int) -> Tensor:
    """The attention mass on each query's ``k`` nearest keys in scalar distance (the keys a sorted
    cache's window of ``k`` reads, seed 002 "Binary Search at Inference"), per query: ``weights``
    and ``distances`` ``(..., L)`` as :meth:`ScalarLayerCapture.weights` and ``.distances`` give them
    (hidden keys at infinite distance); returns ``(...)``. A query seeing at most ``k`` keys gets all
    of its key mass. (:func:`~.common.mass_captured` averages the same over whole maps.)"""
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1 (keys in the window), got {k!r}")
    nearest = distances.topk(min(k, distances.shape[-1]), dim=-1, largest=False).indices
    return weights.gather(-1, nearest).sum(-1)
