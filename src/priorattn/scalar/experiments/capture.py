"""What the scalar layers of a trained GPT compute on token windows, for the seed 002 experiments.

:func:`capture_scalar_layers` runs the model once on ``tokens (B, L)`` and keeps, for every
:class:`~priorattn.scalar.ScalarMultiheadAttention`, the layer's scalar queries and keys, its tau,
the hybrid's vector queries and keys and the values. :meth:`ScalarLayerCapture.weights` then gives
the exact attention weights of any query rows in float64 (the dense definition,
:func:`priorattn.scalar.reference.scalar_weights`), with the sink's weight apart, so a window of 4096
tokens is analysed a block of rows at a time instead of as one ``L x L`` matrix per head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ...functional.grouped import grouped_values
from ...functional.masks import Masking
from ...layers import PriorMultiheadAttention
from ..layers import ScalarMultiheadAttention
from ..reference import Sink, scalar_weights


@dataclass
class ScalarLayerCapture:
    """One scalar layer on a batch of windows: ``q_s, k_s, tau (B, H, L)``, hybrid ``q (B, H, L, Dq)``
    and ``k (B, G, L, Dq)`` (``None`` for pure scalar heads), ``v (B, G, L, D)``, ``positions (B or
    1, L)``; ``block`` is the layer's block index in the model."""

    block: int
    layer: ScalarMultiheadAttention
    q_s: Tensor
    k_s: Tensor
    tau: Tensor
    q: Tensor | None
    k: Tensor | None
    v: Tensor
    positions: Tensor

    @property
    def length(self) -> int:
        return self.q_s.shape[-1]

    def weights(self, rows: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Exact attention weights of the query ``rows`` (default all): ``(B, H, R, L)`` over the
        keys (zero where masked) and the sink's ``(B, H, R)`` (``None`` without a sink), float64."""
        rows = torch.arange(self.length) if rows is None else rows
        layer = self.layer
        masking = Masking(layer.causal, self.positions[:, rows], self.positions, window=layer.window)
        sink = None if layer.sink_value is None else Sink(layer.sink_key, layer.sink_value)
        q = None if self.q is None else self.q[:, :, rows]
        scale = 1.0 if q is None else q.shape[-1] ** -0.5  # scalar_attention's default
        probs = scalar_weights(
            self.q_s[..., rows],
            self.k_s,
            self.tau[..., rows],
            q,
            self.k,
            scale,
            layer.prior,
            masking,
            sink,
            torch.float64,
        )
        if sink is None:
            return probs, None
        return probs[..., 1:], probs[..., 0]

    def output(self, weights: Tensor, sink_weight: Tensor | None) -> Tensor:
        """The attention output ``(B, H, R, D)`` float64 of weights as :meth:`weights` returns them."""
        out = grouped_values(weights, self.v.double())
        if sink_weight is not None:
            per_head = self.layer.sink_value.double().repeat_interleave(
                self.layer.num_heads // self.v.shape[1], 0
            )
            out = out + sink_weight[..., None] * per_head[:, None, :]
        return out

    def distances(self, rows: Tensor | None = None) -> Tensor:
        """``|q_s,i - k_s,j|`` of the query ``rows`` against every key, ``(B, H, R, L)`` float64, with
        ``inf`` for keys the query does not see (later positions, or outside the layer's window)."""
        rows = torch.arange(self.length) if rows is None else rows
        masking = Masking(
            self.layer.causal, self.positions[:, rows], self.positions, window=self.layer.window
        )
        distance = (self.q_s[..., rows, None].double() - self.k_s[..., None, :].double()).abs()
        return distance.masked_fill(~masking.visible(), torch.inf)


def scalar_layers(model) -> list[tuple[int, ScalarMultiheadAttention]]:
    """``(block index, layer)`` of every scalar layer of a GPT (the scalar half of a mixed block too)."""
    found = [(i, m) for i, block in enumerate(model.blocks) for m in block.attn.modules()]
    layers = [(i, m) for i, m in found if isinstance(m, ScalarMultiheadAttention)]
    if not layers:
        raise ValueError(
            "the model has no scalar heads: train it with attention 'scalar', 'hybrid' or 'mixed'"
        )
    return layers


@torch.no_grad()
def capture_scalar_layers(model, tokens: Tensor) -> list[ScalarLayerCapture]:
    """Run ``model`` (a GPT, put in eval mode) on ``tokens (B, L)`` and capture every scalar layer."""
    layers = scalar_layers(model)
    inputs: dict[int, tuple[Tensor, Tensor | None]] = {}

    def remember(key: int):
        def hook(module, args, kwargs):
            inputs[key] = (args[0], kwargs.get("positions"))

        return hook

    model.eval()
    handles = [
        layer.register_forward_pre_hook(remember(i), with_kwargs=True) for i, (_, layer) in enumerate(layers)
    ]
    try:
        model(tokens)
    finally:
        for handle in handles:
            handle.remove()
    captures = []
    for i, (block, layer) in enumerate(layers):
        x, positions = inputs[i]
        B, L, _ = x.shape
        positions = PriorMultiheadAttention._positions(positions, B, L, 0, x.device)
        q, q_s, k, k_s, v = layer.project(x, positions)
        k_s = k_s.transpose(2, 3).reshape(B, layer.num_heads, L)  # (B, G, L, m) -> (B, H, L)
        tau = layer.temperature(x)
        tau = tau.view(1, -1, 1) if tau.dim() < 3 else tau  # () or (H,) -> broadcast over B and L
        tau = tau.expand(B, layer.num_heads, L)
        hybrid = layer.content_dim > 0
        captures.append(
            ScalarLayerCapture(
                block, layer, q_s, k_s, tau, q if hybrid else None, k if hybrid else None, v, positions
            )
        )
    return captures


def nearest_mass(weights: Tensor, distances: Tensor, k: int) -> Tensor:
    """The attention mass on each query's ``k`` nearest keys in scalar distance (the keys a sorted
    cache's window of ``k`` reads, seed 002 "Binary Search at Inference"): ``weights`` and
    ``distances`` ``(..., L)`` as :meth:`ScalarLayerCapture.weights` and ``.distances`` give them;
    returns ``(...)``. A query seeing at most ``k`` keys gets all of its key mass."""
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1 (keys in the window), got {k!r}")
    k = min(k, distances.shape[-1])
    nearest = distances.topk(k, dim=-1, largest=False).indices
    return weights.gather(-1, nearest).sum(-1)
