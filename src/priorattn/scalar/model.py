"""How a :class:`~priorattn.models.GPTConfig` selects scalar attention: its ``attention`` field.

- ``"standard"``: every head dot-product (``PriorMultiheadAttention``), the default, and what a run
  saved before the field existed loads as.
- ``"scalar"``: every head pure scalar (seed 002 "Mechanism").
- ``"hybrid"``: every head scores ``q.k / sqrt(d) - (q_s - k_s)^2 / tau`` (seed 002 "Hybrid").
- ``"mixed"``: ``scalar_heads`` scalar heads next to dot-product heads (seed 002 "Hybrid Architecture").

The other ``scalar_*`` fields configure the scalar heads: ``scalar_groups`` value groups (default:
one per scalar head), ``scalar_tau`` / ``scalar_tau_init`` / ``scalar_tau_cap`` the bandwidth,
``scalar_sink`` a sink key, and ``scalar_tau_length_scaling`` (``None``, or a length ``T``) the rule
``tau (T / n)^2`` for a query seeing ``n > T`` keys
(:func:`~priorattn.scalar.temperature.length_scaled_tau`). Set before training with ``T`` below
``seq_len``, the model learns with the rule, which is then its own attention at every length
(docs/scalar_experiments.md section 8). Set on a model trained without it
(:func:`add_inference_length_rule`, ``T = seq_len``), the rule applies only at inference. A prior
applies to every head of ``"scalar"`` and ``"hybrid"`` layers (seed 002 experiment 6) and to the
dot-product heads of ``"mixed"`` layers.
"""

from __future__ import annotations

import math

from torch import nn

from ..functional.normalizers import regularizer
from ..priors import Prior
from ..token_shift import LayerCaches
from .layers import MixedCache, MixedMultiheadAttention, ScalarMultiheadAttention
from .sorted_decoding import SortedDecoding, SortedLayerCache
from .temperature import TAU_FLOOR, TAU_KINDS, check_train_length

ATTENTIONS = ("standard", "scalar", "hybrid", "mixed")


def check_attention_config(config) -> None:
    """Check (and resolve defaults of) a ``GPTConfig``'s attention fields, naming the field."""
    if config.attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {ATTENTIONS}, got {config.attention!r}")
    if config.scalar_tau not in TAU_KINDS:
        raise ValueError(f"scalar_tau must be one of {TAU_KINDS}, got {config.scalar_tau!r}")
    init, cap = config.scalar_tau_init, config.scalar_tau_cap
    number = isinstance(init, (int, float)) and not isinstance(init, bool)
    if not number or not math.isfinite(init) or init <= TAU_FLOOR:
        raise ValueError(f"scalar_tau_init must be a finite number > {TAU_FLOOR}, got {init!r}")
    if cap is not None and not (isinstance(cap, (int, float)) and math.isfinite(cap) and cap > init):
        raise ValueError(f"scalar_tau_cap must be a finite number above scalar_tau_init={init}, got {cap!r}")
    check_train_length(config.scalar_tau_length_scaling, "scalar_tau_length_scaling")
    if config.attention == "standard":
        names = ("scalar_heads", "scalar_groups", "scalar_tau_length_scaling")
        given = [name for name in names if getattr(config, name) is not None]
        if given or config.scalar_sink:
            name = given[0] if given else "scalar_sink"
            raise ValueError(f"{name} configures scalar heads: set attention to 'scalar', 'hybrid', 'mixed'")
        return
    if not regularizer(config.normalizer).is_softmax:
        raise ValueError(
            f"normalizer={config.normalizer!r} replaces the softmax of dot-product heads only; "
            f"attention={config.attention!r} has scalar heads: use attention='standard'"
        )
    if config.n_kv_heads is not None:
        raise ValueError(
            f"n_kv_heads={config.n_kv_heads} groups dot-product heads; attention={config.attention!r} "
            "groups values with scalar_groups"
        )
    if config.attention == "scalar" and config.encoding in ("rope", "local_rope"):
        raise ValueError(
            f"encoding={config.encoding!r} rotates vector queries and keys; attention='scalar' has "
            "none (use 'hybrid' or 'mixed', or encoding='none')"
        )
    if config.attention == "mixed":
        if config.scalar_heads is None:
            config.scalar_heads = config.n_heads // 2
        if not 0 < config.scalar_heads < config.n_heads:
            raise ValueError(
                f"scalar_heads must be in [1, n_heads - 1] = [1, {config.n_heads - 1}] for mixed "
                f"attention, got {config.scalar_heads!r}"
            )
    elif config.scalar_heads is not None:
        raise ValueError(f"scalar_heads is for attention='mixed', got attention={config.attention!r}")
    heads = scalar_heads(config)
    groups = heads if config.scalar_groups is None else config.scalar_groups
    if not isinstance(groups, int) or groups < 1 or heads % groups:
        raise ValueError(f"scalar_groups must be a positive int dividing {heads} scalar heads, got {groups}")
    if config.scalar_sink and (
        config.window is not None or (config.prior != "uniform" and config.attention != "mixed")
    ):
        raise ValueError("scalar_sink has no position: it takes no prior and no window on its heads")


def scalar_heads(config) -> int:
    """How many heads of a layer are scalar."""
    return {"standard": 0, "mixed": config.scalar_heads}.get(config.attention, config.n_heads)


def prior_heads(config) -> int:
    """How many heads a layer's prior serves: the dot-product ones of a mixed layer, else all."""
    return config.n_heads - scalar_heads(config) if config.attention == "mixed" else config.n_heads


def attention_layer(config, prior: Prior | None) -> nn.Module:
    """The attention of one block for ``config.attention`` other than ``"standard"``."""
    scalar = dict(
        value_groups=config.scalar_groups,
        tau=config.scalar_tau,
        tau_init=config.scalar_tau_init,
        tau_cap=config.scalar_tau_cap,
        tau_length_scaling=config.scalar_tau_length_scaling,
        sink=config.scalar_sink,
        causal=True,
        head_dim=config.head_dim,
        window=config.window,
        backend=config.backend,
    )
    rope = "rope" if config.encoding in ("rope", "local_rope") else None
    if config.attention == "mixed":
        return MixedMultiheadAttention(
            config.d_model, config.n_heads, config.scalar_heads, prior=prior, encoding=rope, **scalar
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
    if attention == "standard":
        raise ValueError("tau length scaling changes scalar heads, and this model has attention='standard'")
    check_train_length(train_len)
    config.scalar_tau_length_scaling = train_len
    for block in model.blocks:
        attention_parts(block.attn)[-1].tau_length_scaling = train_len


def add_inference_length_rule(model, train_len: int) -> None:
    """:func:`set_tau_length_scaling` ``(model, train_len)`` on a model trained without the rule:
    what ``sample`` and ``eval ppl`` ``--tau-length-scaling`` do. A model trained with its own rule
    already applies it at every length, and replacing its ``T`` would change what it learned."""
    own = getattr(model.config, "scalar_tau_length_scaling", None)
    if own is not None:
        raise ValueError(
            f"this model was trained with the length rule (scalar_tau_length_scaling={own}), which "
            "it applies at every length: drop --tau-length-scaling"
        )
    set_tau_length_scaling(model, train_len)


def sorted_caches(model, caches: list, decoding: SortedDecoding) -> LayerCaches:
    """A prefilled ``model``'s caches with every scalar layer's moved into a :class:`SortedLayerCache`
    (a mixed layer's dot-product heads keep their ``KVCache``), for sorted-cache generation; the
    token-shift state of ``caches`` (a :class:`LayerCaches`) goes with them."""
    config = model.config
    if config.attention == "standard":
        raise ValueError(
            "sorted-cache decoding needs scalar heads, and this model has attention='standard' "
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
