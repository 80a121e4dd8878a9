"""How a :class:`~priorattn.models.GPTConfig` selects scalar attention, and what this package
registers for a GPT (:mod:`priorattn.mechanisms`): the mechanisms ``"scalar"``, ``"hybrid"`` and
``"mixed"`` with their options (:class:`~priorattn.scalar.options.ScalarOptions`) and the check of
them, the regularizers as auxiliary losses, and the ``"sorted"`` decoding.

The config's ``attention`` field:

- ``"standard"``: every head dot-product (``PriorMultiheadAttention``), the default, and what a run
  saved before the field existed loads as.
- ``"scalar"``: every head pure scalar (seed 002 "Mechanism").
- ``"hybrid"``: every head scores ``q.k / sqrt(d) - (q_s - k_s)^2 / tau`` (seed 002 "Hybrid").
- ``"mixed"``: ``heads`` scalar heads next to dot-product heads (seed 002 "Hybrid Architecture").

The other options (``config.attention_options``) configure the scalar heads: ``groups`` value
groups (default: one per scalar head), ``tau`` / ``tau_init`` / ``tau_cap`` the bandwidth,
``sink`` a sink key, and ``tau_length_scaling`` (``None``, or a length ``T``) the rule
``tau (T / n)^2`` for a query seeing ``n > T`` keys
(:func:`~priorattn.scalar.temperature.length_scaled_tau`). Set before training with ``T`` below
``seq_len``, the model learns with the rule, which is then its own attention at every length
(docs/scalar_experiments.md section 8). Set on a model trained without it
(:func:`add_inference_length_rule`, ``T = seq_len``), the rule applies only at inference. A prior
applies to every head of ``"scalar"`` and ``"hybrid"`` layers (seed 002 experiment 6) and to the
dot-product heads of ``"mixed"`` layers.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor, nn

from ..functional.normalizers import regularizer
from ..layers import config_rope
from ..mechanisms import (
    AuxLosses,
    register_aux_losses,
    register_decoding,
    register_mechanism,
)
from ..priors import Prior
from ..token_shift import LayerCaches
from .layers import MixedCache, MixedMultiheadAttention, ScalarMultiheadAttention
from .options import ScalarOptions
from .regularizers import Regularization
from .sorted_decoding import SortedDecoding, SortedLayerCache
from .temperature import check_train_length

#: The mechanisms this package registers: the values of ``attention`` with scalar heads.
KINDS = ("scalar", "hybrid", "mixed")


def check_scalar_config(config) -> ScalarOptions:
    """Check a ``GPTConfig`` naming a mechanism of :data:`KINDS` against its options
    (``config.attention_options``, a :class:`ScalarOptions`), naming what is bad; the options with
    the default scalar heads of ``"mixed"`` (half of ``n_heads``) resolved."""
    options = config.attention_options
    if not regularizer(config.normalizer).is_softmax:
        raise ValueError(
            f"normalizer={config.normalizer!r} replaces the softmax of dot-product heads only; "
            f"attention={config.attention!r} has scalar heads: use attention='standard'"
        )
    if config.n_kv_heads is not None:
        raise ValueError(
            f"n_kv_heads={config.n_kv_heads} groups dot-product heads; attention={config.attention!r} "
            "groups values with the option groups"
        )
    if config.attention == "scalar" and config.encoding in ("rope", "local_rope"):
        raise ValueError(
            f"encoding={config.encoding!r} rotates vector queries and keys; attention='scalar' has "
            "none (use 'hybrid' or 'mixed', or encoding='none')"
        )
    if config.attention == "mixed":
        if options.heads is None:
            options = replace(options, heads=config.n_heads // 2)
        if not 0 < options.heads < config.n_heads:
            raise ValueError(
                f"heads must be in [1, n_heads - 1] = [1, {config.n_heads - 1}] for mixed "
                f"attention, got {options.heads!r}"
            )
    elif options.heads is not None:
        raise ValueError(f"heads is for attention='mixed', got attention={config.attention!r}")
    heads = options.heads if config.attention == "mixed" else config.n_heads
    groups = heads if options.groups is None else options.groups
    if heads % groups:
        raise ValueError(f"groups must be a positive int dividing {heads} scalar heads, got {groups}")
    if options.sink and (
        config.window is not None or (config.prior != "uniform" and config.attention != "mixed")
    ):
        raise ValueError("sink has no position: it takes no prior and no window on its heads")
    return options


def scalar_heads(config) -> int:
    """How many heads of a layer are scalar."""
    if config.attention not in KINDS:
        return 0
    return config.attention_options.heads if config.attention == "mixed" else config.n_heads


def prior_heads(config) -> int:
    """How many heads a layer's prior serves: the dot-product ones of a mixed layer, else all."""
    return config.n_heads - scalar_heads(config) if config.attention == "mixed" else config.n_heads


def attention_layer(config, prior: Prior | None) -> nn.Module:
    """The attention of one block for ``config.attention`` in :data:`KINDS`."""
    options = config.attention_options
    scalar = dict(
        value_groups=options.groups,
        tau=options.tau,
        tau_init=options.tau_init,
        tau_cap=options.tau_cap,
        tau_length_scaling=options.tau_length_scaling,
        sink=options.sink,
        causal=True,
        head_dim=config.head_dim,
        window=config.window,
        backend=config.backend,
    )
    rope = config_rope(config)
    if config.attention == "mixed":
        return MixedMultiheadAttention(
            config.d_model, config.n_heads, options.heads, prior=prior, encoding=rope, **scalar
        )
    hybrid = config.attention == "hybrid"
    encoding = rope if hybrid else None
    return ScalarMultiheadAttention(
        config.d_model, config.n_heads, hybrid=hybrid, encoding=encoding, prior=prior, **scalar
    )


def attention_parts(attn: nn.Module) -> tuple[nn.Module, ...]:
    """The layers with ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj`` inside a block's attention."""
    return (attn.dot, attn.scalar) if isinstance(attn, MixedMultiheadAttention) else (attn,)


def set_tau_length_scaling(model, train_len: int | None) -> None:
    """Turn the length rule of every scalar head of ``model`` (a :class:`~priorattn.models.GPT`) on
    with the training length ``train_len`` (``model.config.seq_len`` for a trained run), or off with
    ``None``; recorded in ``model.config``. Full passes, KV-cache and sorted-cache generation alike
    read it."""
    config = model.config
    attention = getattr(config, "attention", "standard")  # a transformers model (hf-extend) has none
    if attention not in KINDS:
        raise ValueError(
            f"tau length scaling changes scalar heads, and this model has attention={attention!r}"
        )
    check_train_length(train_len)
    config.attention_options = replace(config.attention_options, tau_length_scaling=train_len)
    for block in model.blocks:
        attention_parts(block.attn)[-1].tau_length_scaling = train_len


def add_inference_length_rule(model, train_len: int) -> None:
    """:func:`set_tau_length_scaling` ``(model, train_len)`` on a model trained without the rule:
    what ``sample`` and ``eval ppl`` ``--tau-length-scaling`` do. A model trained with its own rule
    already applies it at every length, and replacing its ``T`` would change what it learned."""
    options = getattr(model.config, "attention_options", None)
    own = getattr(options, "tau_length_scaling", None)
    if own is not None:
        raise ValueError(
            f"this model was trained with the length rule (tau_length_scaling={own}), which "
            "it applies at every length: drop --tau-length-scaling"
        )
    set_tau_length_scaling(model, train_len)


def sorted_caches(model, caches: list, decoding: SortedDecoding) -> LayerCaches:
    """A prefilled ``model``'s caches with every scalar layer's moved into a :class:`SortedLayerCache`
    (a mixed layer's dot-product heads keep their ``KVCache``), for sorted-cache generation; the
    token-shift state of ``caches`` (a :class:`LayerCaches`) goes with them."""
    config = model.config
    if config.attention not in KINDS:
        raise ValueError(
            f"sorted-cache decoding needs scalar heads, and this model has attention={config.attention!r} "
            "(train with --attention scalar, hybrid or mixed)"
        )
    if config.prior != "uniform" and config.attention != "mixed":
        raise ValueError(
            f"prior={config.prior!r} adds a log-prior of token positions to every scalar head: a cache "
            "sorted by scalar key cannot find the largest scores (use a model without a prior)"
        )
    if config.window is not None:
        raise ValueError(
            f"window={config.window} hides keys by position: a cache sorted by scalar key cannot "
            "(use a model without a window)"
        )
    sorted_ = LayerCaches(shift=getattr(caches, "shift", None))  # a plain list carries none
    for block, cache in zip(model.blocks, caches):
        if isinstance(block.attn, MixedMultiheadAttention):
            sorted_.append(MixedCache(cache.dot, SortedLayerCache(block.attn.scalar, cache.scalar, decoding)))
        else:
            sorted_.append(SortedLayerCache(block.attn, cache, decoding))
    return sorted_


class Regularizer(AuxLosses):
    """Applies a :class:`Regularization` to the scalar layers of a model during training: the
    model's auxiliary losses (:meth:`priorattn.models.GPT.aux_losses`).

    Each step, :meth:`start` tells every :class:`~priorattn.scalar.ScalarMultiheadAttention` which
    terms to compute in its training forward passes (those with a weight at this step), and after each
    forward pass :meth:`losses` returns ``weight_t * mean_over_layers(term_t)`` by term name: the mean
    over layers keeps a weight's meaning independent of depth. :meth:`logged` gives the step's
    unweighted terms (averaged over its forward passes) as ``reg_align``, ``reg_spread``,
    ``reg_tau``, and the mean bandwidth as ``tau``.
    """

    def __init__(self, model: nn.Module, regularization: Regularization):
        self.regularization = regularization
        self.layers = [m for m in model.modules() if isinstance(m, ScalarMultiheadAttention)]
        if regularization.active and not self.layers:
            raise ValueError(
                "the scalar regularizers (reg_align, reg_spread, reg_tau) need scalar heads: "
                "train a model with attention='scalar', 'hybrid' or 'mixed'"
            )
        self.weights: dict[str, float] = {}
        self.sums: dict[str, float] = {}
        self.passes = 0

    def start(self, step: int) -> None:
        self.weights = {n: w for n, w in self.regularization.weights(step).items() if w > 0}
        self.sums, self.passes = {}, 0
        for layer in self.layers:
            layer.track = tuple(self.weights)
            layer.spread_range = self.regularization.spread_range

    def losses(self) -> dict[str, Tensor]:
        """The weighted terms of the last forward pass, by name (empty when no term is on)."""
        if not self.weights:
            return {}
        losses = {}
        for name, weight in self.weights.items():
            term = torch.stack([layer.terms[name] for layer in self.layers]).mean()
            self.sums[name] = self.sums.get(name, 0.0) + float(term.detach())
            losses[name] = weight * term
        for layer in self.layers:
            layer.terms = {}
        self.passes += 1
        return losses

    def logged(self) -> dict[str, float]:
        """The step's unweighted terms, and ``tau``: the mean bandwidth over the scalar layers, heads
        (and tokens) of the last forward pass (seed 002 experiment 3's "tau trajectory")."""
        logged = {f"reg_{name}": value / max(self.passes, 1) for name, value in self.sums.items()}
        seen = [layer.last_tau.mean() for layer in self.layers if layer.last_tau is not None]
        if seen:
            logged["tau"] = float(torch.stack(seen).mean())
        return logged


def regularizer_of(model: nn.Module) -> Regularizer:
    """The :class:`Regularizer` of ``model``: its options' ``reg_*`` weights where they are a
    :class:`ScalarOptions`, else none (a model of another mechanism has no scalar heads)."""
    options = model.config.attention_options
    if not isinstance(options, ScalarOptions):
        return Regularizer(model, Regularization())
    return Regularizer(model, options.regularization())


for _kind in KINDS:
    register_mechanism(
        _kind, attention_layer, prior_heads=prior_heads, options=ScalarOptions, check=check_scalar_config
    )
register_aux_losses(regularizer_of)
register_decoding("sorted", SortedDecoding, sorted_caches)
