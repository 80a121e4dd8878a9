"""Configs saved before the prior registry and mechanism options, read today.

Before the prior registry a ``GPTConfig`` (and what ``priorattn.hf.add_prior`` recorded) named its prior
(``"goat"``, ``"alibi+ggd"``) and held GOAT's and GGD's options as flattened fields of its own
(:data:`LEGACY_PRIOR_FIELDS`). They are now options of the prior spec; :func:`legacy_spec` moves
them there, so such a config builds the same model (same parameter names, same outputs:
``tests/models/test_legacy_configs.py``). Likewise a ``GPTConfig`` held the options of scalar heads
as flattened ``scalar_*`` fields, and a ``TrainConfig`` their regularizers as ``reg_*`` fields:
they are now ``GPTConfig.attention_options`` (:func:`with_attention_options`,
:func:`run_with_attention_options`).
"""

from __future__ import annotations

from dataclasses import fields

from ..mechanisms import legacy_fields, mechanism, takers
from ..priors import with_defaults

#: Flattened field -> (the prior it configured, its option there).
LEGACY_PRIOR_FIELDS = {
    "goat_freqs": ("goat", "num_freqs"),
    "goat_sink": ("goat", "sink"),
    "goat_slope": ("goat", "slope"),
    "goat_sink_freqs": ("goat", "sink_freqs"),
    "goat_sink_hidden": ("goat", "sink_hidden"),
    "ggd_trainable": ("ggd", "trainable"),
}


#: Flattened field -> what its true and false read as today: GOAT's sink then was the per-head one
#: with a linear decay, its slope the learned one (a run's saved slope loads as ``softplus`` of a raw
#: parameter).
LEGACY_VALUES = {
    "goat_sink": {True: "per_head", False: "none"},
    "goat_slope": {True: "learned", False: "none"},
}


def legacy_spec(prior: str, flattened: dict) -> dict | list:
    """``prior`` (a name or names joined by ``+``, as saved then) with the ``flattened`` fields'
    values as the options of the priors they configured (those it does not hold are dropped)."""
    by_prior: dict[str, dict] = {}
    for field, value in flattened.items():
        name, option = LEGACY_PRIOR_FIELDS[field]
        by_prior.setdefault(name, {})[option] = (
            LEGACY_VALUES[field][value] if field in LEGACY_VALUES else value
        )
    if "goat" in prior.split("+"):  # GOAT's sink then, where the fields left it at its default
        by_prior.setdefault("goat", {}).setdefault("sink", "per_head")
    return with_defaults(prior, **by_prior)


def upgraded(data: dict) -> dict:
    """A saved ``GPTConfig`` dict with its flattened prior fields, if any, moved into ``prior``."""
    flattened = {key: data[key] for key in LEGACY_PRIOR_FIELDS if key in data}
    if not flattened:
        return data
    kept = {key: value for key, value in data.items() if key not in LEGACY_PRIOR_FIELDS}
    return kept | dict(prior=legacy_spec(data.get("prior", "uniform"), flattened))


def with_attention_options(data: dict) -> dict:
    """A saved ``GPTConfig`` dict with the flattened options of a mechanism (``scalar_heads``,
    and the ``reg_*`` a run's train section held: :func:`run_with_attention_options`) moved into
    ``attention_options``. A flattened option of another mechanism than the config's loads where it
    holds its default (every config then saved them all); another value cannot be represented and
    is a ``ValueError`` naming it."""
    legacy = legacy_fields()
    flattened = {key: data[key] for key in legacy if key in data}
    if not flattened:
        return data
    kept = {key: value for key, value in data.items() if key not in legacy}
    attention = data.get("attention", "standard")
    own = mechanism(attention).options
    options = dict(kept.get("attention_options") or {})
    for old, value in flattened.items():
        cls, new = legacy[old]
        if cls is own:
            options.setdefault(new, value)
            continue
        default = next(f.default for f in fields(cls) if f.name == new)
        if value != default and not (isinstance(default, tuple) and tuple(value) == default):
            raise ValueError(
                f"this config holds {old}={value!r}, an option of attention="
                f"{' or '.join(map(repr, takers(cls)))}, but its attention is {attention!r}: "
                "it cannot be represented (set attention, or drop the field)"
            )
    return kept | dict(attention_options=options or None)


def run_with_attention_options(configs: dict) -> dict:
    """A run's saved configs (``{"model": ..., "train": ...}``) with the mechanism options its train
    section held (the scalar regularizers' ``reg_*``, :func:`legacy_fields`) moved to its model
    section, where :func:`with_attention_options` reads them."""
    train = configs.get("train")
    if not isinstance(train, dict) or not isinstance(configs.get("model"), dict):
        return configs
    moved = {key: value for key, value in train.items() if key in legacy_fields()}
    if not moved:
        return configs
    kept = {key: value for key, value in train.items() if key not in moved}
    return configs | dict(model=configs["model"] | moved, train=kept)
