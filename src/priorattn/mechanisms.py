"""The attention mechanisms (the ``"attention"`` kind of :mod:`priorattn.registry`): what a
:class:`~priorattn.models.GPT` builds its attention from, without naming any of them.

A mechanism package registers, when it is imported (``import priorattn`` imports every one):

- its mechanisms, by the name ``GPTConfig.attention`` gives (:func:`register_mechanism`): how one
  block's attention is built from the config and the layer's prior, and how many heads that prior
  serves;
- a check of the ``GPTConfig`` fields it reads (:func:`register_config_check`), run on every
  config whichever mechanism it names, so that its options set for another mechanism are refused
  by name;
- the auxiliary losses its layers add to the training loss (:func:`register_aux_losses`), built
  for every model from the training settings that weigh them;
- a decoding path (:func:`register_decoding`): a class of decoding options, and how one of them
  turns a prefilled model's caches into the ones generation continues from.

The prior layer (:mod:`priorattn.layers`) registers ``"standard"``; :mod:`priorattn.scalar`
registers ``"scalar"``, ``"hybrid"`` and ``"mixed"``, its config fields' check, its regularizers
(seed 002) and its sorted-cache decoding. The model and the training loop ask this module.
"""

from __future__ import annotations

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
    """

    build: Callable[[Any, nn.Module | None], nn.Module]
    prior_heads: Callable[[Any], int] = every_head


_CONFIG_CHECKS: list[Callable[[Any], None]] = []
_AUX_LOSSES: list[Callable[[nn.Module, Mapping[str, Any]], AuxLosses]] = []
_DECODINGS: dict[type, Callable[[nn.Module, list, Any], list]] = {}


def register_mechanism(
    name: str,
    build: Callable[[Any, nn.Module | None], nn.Module],
    *,
    prior_heads: Callable[[Any], int] = every_head,
) -> None:
    """Make ``name`` a value of ``GPTConfig.attention``, built by ``build`` (see :class:`Mechanism`).

    A name is registered once: registering it again is a ``ValueError``.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty str, got {name!r}")
    if name in registry.names("attention"):
        raise ValueError(f"the attention mechanism {name!r} is already registered")
    for argument, value in (("build", build), ("prior_heads", prior_heads)):
        if not callable(value):
            raise TypeError(f"{argument} must be callable, got {type(value).__name__}")
    registry.register("attention", name, Mechanism(build, prior_heads))


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


def register_config_check(check: Callable[[Any], None]) -> None:
    """Run ``check(config)`` on every ``GPTConfig`` (:func:`check_attention_config`): it raises a
    one-line ``ValueError`` naming a field it reads that is bad, or set for a mechanism the config
    does not name, and may resolve those fields' defaults in place."""
    if not callable(check):
        raise TypeError(f"check must be callable, got {type(check).__name__}")
    _CONFIG_CHECKS.append(check)


def check_attention_config(config) -> None:
    """Check a ``GPTConfig``'s ``attention`` (a registered name) and, with every registered check,
    the fields the mechanism packages read."""
    mechanism(config.attention)
    for check in _CONFIG_CHECKS:
        check(config)


class AuxLosses(ABC):
    """The auxiliary losses a package's layers add to a model's training loss (seed 002's scalar
    regularizers), weighed and scheduled by the training settings they were built with.

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


def register_aux_losses(build: Callable[[nn.Module, Mapping[str, Any]], AuxLosses]) -> None:
    """Build a model's auxiliary losses with ``build(model, settings)`` (:func:`aux_losses`):
    ``settings`` holds every package's training settings by name, ``build`` reads its own and
    raises a one-line ``ValueError`` when they ask for a loss the model's layers cannot give."""
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


def aux_losses(model: nn.Module, settings: Mapping[str, Any]) -> AuxLosses:
    """The auxiliary losses of ``model`` under the training ``settings``: every registered
    package's (each with nothing to add when the settings turn none of its losses on)."""
    return _AllAuxLosses([build(model, settings) for build in _AUX_LOSSES])


def register_decoding(kind: type, caches: Callable[[nn.Module, list, Any], list]) -> None:
    """Make instances of ``kind`` decoding options of ``GPT.generate``: after the prefill,
    ``caches(model, prefilled_caches, option)`` gives the caches generation continues from (and
    raises a one-line ``ValueError`` for a model it cannot serve)."""
    if not isinstance(kind, type):
        raise TypeError(f"kind must be a class, got {type(kind).__name__}")
    if not callable(caches):
        raise TypeError(f"caches must be callable, got {type(caches).__name__}")
    _DECODINGS[kind] = caches


def decoding_path(name: str, option: object) -> Callable[[nn.Module, list, Any], list]:
    """The ``caches`` function registered for ``option``'s class; a ``TypeError`` naming the argument
    ``name`` and the registered classes otherwise."""
    for kind, caches in _DECODINGS.items():
        if isinstance(option, kind):
            return caches
    kinds = " or ".join(kind.__name__ for kind in _DECODINGS) or "registered decoding option"
    raise TypeError(f"{name} must be a {kinds}, got {type(option).__name__}")
