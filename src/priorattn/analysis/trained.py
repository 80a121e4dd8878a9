"""What every look inside a trained run shares: its runs, the layers and heads asked for, its priors,
and the attention weights of its layers.

A layer's weights are read by swapping its normalizer for a recording one for the length of a
``with`` block (:func:`capturing`): the attention op sends any normalizer other than plain softmax to
the reference route (the definition), which hands the normalizer the full logits of every query.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import Tensor

from ..functional.normalizers import Regularizer, regularizer
from ..layers import PriorMultiheadAttention
from ..priors import Prior, Uniform
from ..train.runs import CONFIG_JSON


def pick_indices(name: str, chosen: Sequence[int] | None, count: int, what: str) -> list[int]:
    """``chosen`` (all of ``range(count)`` if None), each checked: ``name`` says what an index is
    ("layer"), ``what`` what the model has ``count`` of ("layers")."""
    if chosen is None:
        return list(range(count))
    bad = [i for i in chosen if not 0 <= i < count]
    if bad:
        raise ValueError(f"{name} {bad[0]} is out of range: the model has {count} {what} (0 to {count - 1})")
    return list(chosen)


def runs_in(path: str | Path) -> list[Path]:
    """The run directories ``path`` names: itself if it holds a run, else the models of a
    ``priorattn compare`` output (``path/models/*``)."""
    path = Path(path)
    if (path / CONFIG_JSON).exists():
        return [path]
    models = sorted(d for d in (path / "models").glob("*") if (d / CONFIG_JSON).exists())
    if not models:
        raise FileNotFoundError(
            f"{path} holds no run ({CONFIG_JSON} is missing) and no compare output "
            f"(no models/*/{CONFIG_JSON})"
        )
    return models


def layer_prior(model, layer: int) -> Prior:
    """The prior of attention layer ``layer``; :class:`Uniform` (standard attention) where it has none."""
    prior = model.blocks[layer].attn.prior
    return Uniform() if prior is None else prior


class WeightCapture(Regularizer):
    """A layer's own map (softmax, sparsemax, entmax) that records the weights ``p: (B, H, Lq, Lk)``
    of every call in ``weights``."""

    def __init__(self, normalizer: str | float | Regularizer):
        self.map = regularizer(normalizer)
        super().__init__(self.map.tau)
        self.weights: list[Tensor] = []

    def normalize(self, scores: Tensor, visible: Tensor | None = None) -> Tensor:
        p = self.map.normalize(scores, visible)
        self.weights.append(p.detach())
        return p


@contextmanager
def capturing(model, make_capture: Callable[[PriorMultiheadAttention], Regularizer]):
    """Every attention layer of ``model`` normalizes through ``make_capture(layer)`` on the reference
    route; yields the captures, one per layer, and restores the layers afterwards."""
    layers = [block.attn for block in model.blocks]
    if not all(isinstance(layer, PriorMultiheadAttention) for layer in layers):
        raise ValueError(
            f"attention weights are read from dot-product attention layers; this model has "
            f"attention={model.config.attention!r} (seed 002 scalar heads)"
        )
    saved = [(layer.normalizer, layer.backend) for layer in layers]
    captures = [make_capture(layer) for layer in layers]
    try:
        for layer, capture in zip(layers, captures):
            layer.normalizer, layer.backend = capture, "reference"
        yield captures
    finally:
        for layer, (normalizer, backend) in zip(layers, saved):
            layer.normalizer, layer.backend = normalizer, backend


@torch.no_grad()
def attention_weights(model, tokens: Tensor) -> list[Tensor]:
    """Each layer's attention weights ``(B, H, L, L)`` on ``tokens: (B, L)``, from the layer's own map."""
    with capturing(model, lambda layer: WeightCapture(layer.normalizer)) as captures:
        model(tokens)
    return [capture.weights[0] for capture in captures]
