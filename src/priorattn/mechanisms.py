"""The attention mechanisms (the ``"attention"`` kind of :mod:`priorattn.registry`): what a
:class:`~priorattn.models.GPT` builds its attention from, without naming any of them.

A mechanism package registers, when it is imported (``import priorattn`` imports every one):

- its mechanisms, by the name ``GPTConfig.attention`` gives (:func:`register_mechanism`): how one
  block's attention is built from the config and the layer's prior, how many heads that prior
  serves, the frozen dataclass of its options (``GPTConfig.attention_options`` holds one, saved
  nested in the config; several mechanisms may share a class) and a check of them against the
  rest of the config;
- the auxiliary losses its layers add to the training loss (:func:`register_aux_losses`), built
  for every model from the options that weigh them;
- decoding paths by name (:func:`register_decoding`): a class of decoding options, and how one of
  them turns a prefilled model's caches into the ones generation continues from.

The prior layer (:mod:`priorattn.layers`) registers ``"standard"`` and ``"fox"``;
:mod:`priorattn.scalar` registers ``"scalar"``, ``"hybrid"`` and ``"mixed"`` with their options
(:class:`~priorattn.scalar.ScalarOptions`: the heads' shape and the regularizers' weights), its
regularizers (seed 002) and its ``"sorted"`` decoding. The model and the training loop ask this
module.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from . import registry


def every_head(config) -> int:
    """``config.n_heads``: a layer's prior serves every head (what most mechanisms do)."""
    return config.n_heads


@dataclass(frozen=True)
class Mechanism:
    """One attention mechanism, as :func:`register_mechanism` records it.

    ``build(config, prior)``: one block's attention for a ``GPTConfig`` naming this mechanism and
    the layer's prior (``None`` for none; built for :func:`prior_heads` heads). The module is called
    as :class:`~priorattn.PriorMultiheadAttention`: ``y, cache = attn(x, positions=..., doc_ids=...,
    cache=...)`` with ``x, y: (B, L, d_model)``, its cache whatever it needs with ``len(cache)`` the
    tokens seen, and it has a ``prior`` attribute (the prior given, or ``None``). Its submodules
    with ``q_proj``, ``k_proj``, ``v_proj`` and ``out_proj`` get the GPT's initialisation.

    ``prior_heads(config)``: how many heads of a layer its prior serves.

    ``options``: the frozen dataclass of its options, or ``None`` for a mechanism that takes none;
    ``GPTConfig.attention_options`` holds an instance (:func:`attention_options`). Its docstring
    documents each field with a ``- ``name``: ...`` bullet, as every config here does (the
    ``train`` command's flags read them). A class attribute ``LEGACY_FIELDS``, where it has one,
    maps the flattened fields a saved config held the options in (``scalar_heads``) to the options'
    names (``heads``): :func:`legacy_fields`.

    ``check(config)``: checks the options against the rest of a ``GPTConfig`` naming this
    mechanism (``config.attention_options`` is an ``options`` instance then), raising a one-line
    ``ValueError`` naming what is bad; it returns the options with the defaults that depend on the
    config resolved (``dataclasses.replace``), or ``None`` to keep them.
    """

    build: Callable[[Any, nn.Module | None], nn.Module]
    prior_heads: Callable[[Any], int] = every_head
    options: type | None = None
    check: Callable[[Any], Any] | None = None


_AUX_LOSSES: list[Callable[[nn.Module], AuxLosses]] = []


@dataclass(frozen=True)
class Decoding:
    """One decoding path, as :func:`register_decoding` records it: the class of its ``options``
    and ``caches(model, prefilled_caches, options)``."""

    options: type
    caches: Callable[[nn.Module, list, Any], list]


_DECODINGS: dict[str, Decoding] = {}


def register_mechanism(
    name: str,
    build: Callable[[Any, nn.Module | None], nn.Module],
    *,
    prior_heads: Callable[[Any], int] = every_head,
    options: type | None = None,
    check: Callable[[Any], Any] | None = None,
) -> None:
    """Make ``name`` a value of ``GPTConfig.attention``, built by ``build``, with the ``options``
    dataclass it takes and their ``check`` (see :class:`Mechanism`).

    A name is registered once: registering it again is a ``ValueError``.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty str, got {name!r}")
    if name in registry.names("attention"):
        raise ValueError(f"the attention mechanism {name!r} is already registered")
    for argument, value in (("build", build), ("prior_heads", prior_heads)):
        if not callable(value):
            raise TypeError(f"{argument} must be callable, got {type(value).__name__}")
    if options is not None and not (isinstance(options, type) and dataclasses.is_dataclass(options)):
        raise TypeError(f"options must be a dataclass, got {options!r}")
    if options is not None and not options.__dataclass_params__.frozen:
        raise TypeError(f"options must be a frozen dataclass, and {options.__name__} is not")
    if check is not None and not callable(check):
        raise TypeError(f"check must be callable, got {type(check).__name__}")
    registry.register("attention", name, Mechanism(build, prior_heads, options, check))


def mechanism_names() -> tuple[str, ...]:
    """The registered mechanisms' names, in the order they were registered."""
    return registry.names("attention")


def mechanism(name: str) -> Mechanism:
    """The mechanism registered as ``name``; a ``ValueError`` listing the registered names otherwise."""
    if isinstance(name, str) and name in registry.names("attention"):
        return registry.entries("attention")[name]
    raise ValueError(
        f"attention must be one of {mechanism_names()}, got {name!r}{registry.elsewhere(name, 'attention')}"
    )


def options_classes() -> tuple[type, ...]:
    """The registered mechanisms' options classes, each once, in the order they were registered."""
    classes = (entry.options for entry in registry.entries("attention").values())
    return tuple(dict.fromkeys(cls for cls in classes if cls is not None))


def takers(cls: type) -> tuple[str, ...]:
    """The mechanisms whose options are ``cls``."""
    return tuple(name for name, entry in registry.entries("attention").items() if entry.options is cls)


def attention_options(name: str, given: object) -> object:
    """The options of mechanism ``name`` from ``given``: ``None`` (its defaults), a dict of some of
    them, or an instance of its options class. A mechanism without options takes ``None`` or an
    empty dict (and gives ``None``). Options it does not have are a one-line ``ValueError`` naming
    them, the ones it has, and the mechanisms that have them."""
    cls = mechanism(name).options
    if given is None or (isinstance(given, Mapping) and not given and cls is None):
        return None if cls is None else cls()
    if cls is not None and isinstance(given, cls):
        return given
    if dataclasses.is_dataclass(given) and not isinstance(given, type):
        owners = ", ".join(map(repr, takers(type(given)))) or "no mechanism"
        takes = f"takes {cls.__name__}" if cls else "takes no options"
        raise ValueError(
            f"attention_options is a {type(given).__name__} (the options of {owners}), and "
            f"attention={name!r} {takes}"
        )
    if not isinstance(given, Mapping):
        raise ValueError(f"attention_options must be a dict or None, got {type(given).__name__}")
    own = option_names(name)
    unknown = [key for key in given if key not in own]
    if unknown:
        owners = [n for n in registry.names("attention") if set(unknown) <= set(option_names(n))]
        names = ", ".join(map(repr, unknown))
        plural = len(unknown) > 1
        options = f"option{'s' if plural else ''} {names}"
        elsewhere = f"; {names} {'are options' if plural else 'is an option'} of " if owners else ""
        elsewhere += ", ".join(map(repr, owners))
        valid = f"its options are {', '.join(own)}" if own else "it takes none"
        raise ValueError(f"attention={name!r} has no {options}: {valid}{elsewhere}")
    return cls(**given)


def option_names(name: str) -> tuple[str, ...]:
    """The option names of mechanism ``name``, in their class's order (empty for one without options)."""
    cls = mechanism(name).options
    return () if cls is None else tuple(f.name for f in dataclasses.fields(cls) if f.init)


def legacy_fields() -> dict[str, tuple[type, str]]:
    """Every flattened field a saved config held mechanism options in, with the options class and
    the option it now is (each options class's ``LEGACY_FIELDS``)."""
    return {
        old: (cls, new) for cls in options_classes() for old, new in getattr(cls, "LEGACY_FIELDS", {}).items()
    }


def check_attention_config(config) -> None:
    """Check a ``GPTConfig``'s ``attention`` (a registered name), make ``attention_options`` its
    options (:func:`attention_options`) and check them with the mechanism's ``check``."""
    entry = mechanism(config.attention)
    config.attention_options = attention_options(config.attention, config.attention_options)
    if entry.check is not None:
        resolved = entry.check(config)
        if resolved is not None:
            config.attention_options = resolved


class AuxLosses(ABC):
    """The auxiliary losses a package's layers add to a model's training loss (seed 002's scalar
    regularizers), weighed and scheduled by the options they were built with.

    Each optimizer step, :meth:`start` comes before its forward passes and :meth:`losses` after
    each of them; :meth:`logged` then gives what the step logs.
    """

    @abstractmethod
    def start(self, step: int) -> None:
        """Optimizer step ``step`` (0-based) begins: set which losses its training passes compute."""

    @abstractmethod
    def losses(self) -> dict[str, Tensor]:
        """The weighted losses of the latest training forward pass, by name (empty when none is on):
        the training objective adds their sum."""

    @abstractmethod
    def logged(self) -> dict[str, float]:
        """What the step logs, by its name in ``metrics.jsonl``."""


def register_aux_losses(build: Callable[[nn.Module], AuxLosses]) -> None:
    """Build a model's auxiliary losses with ``build(model)`` (:func:`aux_losses`), from the
    options of the model's mechanism (``model.config.attention_options``) where they are the
    package's: a model of another mechanism gets none."""
    if not callable(build):
        raise TypeError(f"build must be callable, got {type(build).__name__}")
    _AUX_LOSSES.append(build)


class _AllAuxLosses(AuxLosses):
    """The auxiliary losses of every registered package, as one."""

    def __init__(self, parts: list[AuxLosses]):
        self.parts = parts

    def start(self, step: int) -> None:
        for part in self.parts:
            part.start(step)

    def losses(self) -> dict[str, Tensor]:
        return {name: loss for part in self.parts for name, loss in part.losses().items()}

    def logged(self) -> dict[str, float]:
        return {name: value for part in self.parts for name, value in part.logged().items()}


def aux_losses(model: nn.Module) -> AuxLosses:
    """The auxiliary losses of ``model``: every registered package's (each with nothing to add
    when the model's options turn none of its losses on)."""
    return _AllAuxLosses([build(model) for build in _AUX_LOSSES])


def register_decoding(name: str, options: type, caches: Callable[[nn.Module, list, Any], list]) -> None:
    """Make ``name`` a decoding of ``GPT.generate(decoding=...)``, with the dataclass of its
    ``options``: after the prefill, ``caches(model, prefilled_caches, options)`` gives the caches
    generation continues from (and raises a one-line ``ValueError`` for a model it cannot serve)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty str, got {name!r}")
    if not isinstance(options, type):
        raise TypeError(f"options must be a class, got {type(options).__name__}")
    if not callable(caches):
        raise TypeError(f"caches must be callable, got {type(caches).__name__}")
    taken = _DECODINGS.get(name)
    if taken is not None and taken != Decoding(options, caches):
        raise ValueError(f"the decoding {name!r} is already registered")
    _DECODINGS[name] = Decoding(options, caches)


def decoding_names() -> tuple[str, ...]:
    """The registered decodings' names."""
    return tuple(_DECODINGS)


def decoding(name: str, options: object = None) -> tuple[Decoding, object]:
    """The decoding registered as ``name`` and its options from ``options``: ``None`` (its
    defaults), a dict of them, or an instance of its options class. An unknown name, or options of
    another kind, is a ``ValueError`` naming the argument and what it takes."""
    if not isinstance(name, str) or name not in _DECODINGS:
        raise ValueError(f"decoding must be one of {decoding_names()}, got {name!r}")
    entry = _DECODINGS[name]
    if isinstance(options, entry.options):
        return entry, options
    if options is None or isinstance(options, Mapping):
        try:
            return entry, entry.options(**(options or {}))
        except TypeError as error:  # a missing or unknown option
            raise ValueError(f"decoding_options for decoding={name!r}: {error}") from None
    raise ValueError(
        f"decoding_options for decoding={name!r} must be a dict or a {entry.options.__name__}, "
        f"got {type(options).__name__}"
    )
