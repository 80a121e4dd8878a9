"""The one registry: every name a model can be built from, by kind.

- ``"prior"``: a prior class and its options, registered by its own file
  (:func:`priorattn.priors.register`); a ``GPTConfig.prior`` spec names it.
- ``"encoding"``: a value of ``GPTConfig.encoding`` (:mod:`priorattn.encodings`).
- ``"attention"``: an attention mechanism, a value of ``GPTConfig.attention``
  (:func:`priorattn.mechanisms.register_mechanism`).
- ``"model"``: a named model, the ``GPTConfig`` fields that make it: NoPE, RoPE, BAM (GGD), GOAT's
  ablations (each a spec of GOAT's options), FoX (:mod:`priorattn.models.named`).
- ``"grid position"``: a position mechanism over a 2-D grid of patches, what the vision study's ViT
  takes in every layer (its 2-D GOAT and ALiBi priors, 2-D RoPE, learned embeddings;
  :mod:`priorattn.studies.vision.model`). Not a ``"prior"``: its positions are packed grid cells,
  which no sequence model has.

Each kind's own module registers and reads its entries with its own checks; this module keeps them
in one place, so that a name is looked up once and a name given as the wrong kind is answered with
the kind it is (``"fox"`` given as a prior: "fox is an attention mechanism and a model").
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

#: The kinds, each with how a message names one of its entries.
KINDS = {
    "prior": "a prior",
    "encoding": "an encoding",
    "attention": "an attention mechanism",
    "model": "a model",
    "grid position": "a grid position",
}

_ENTRIES: dict[str, dict[str, object]] = {kind: {} for kind in KINDS}


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {tuple(KINDS)}, got {kind!r}")


def register(kind: str, name: str, entry: object) -> None:
    """Record ``entry`` as the ``kind`` named ``name``. Registering the same entry again does
    nothing; another entry under a taken name is a ``ValueError``."""
    _check_kind(kind)
    if not isinstance(name, str) or not name:
        raise ValueError(f"a name must be a non-empty str, got {name!r}")
    taken = _ENTRIES[kind].get(name)
    if taken is not None and taken != entry:
        raise ValueError(f"{KINDS[kind]} named {name!r} is already registered")
    _ENTRIES[kind][name] = entry


def entries(kind: str) -> Mapping[str, object]:
    """The entries of ``kind`` by name, in the order they were registered (a read-only view)."""
    _check_kind(kind)
    return MappingProxyType(_ENTRIES[kind])


def names(kind: str) -> tuple[str, ...]:
    """The names of ``kind``, in the order they were registered."""
    return tuple(entries(kind))


def kinds_of(name: str) -> tuple[str, ...]:
    """The kinds that hold an entry named ``name``."""
    return tuple(kind for kind, table in _ENTRIES.items() if name in table)


def lookup(kind: str, name: str) -> object:
    """The entry of ``kind`` named ``name``; a ``ValueError`` that lists the names of ``kind`` and,
    where ``name`` is registered as another kind, says which (:func:`elsewhere`)."""
    _check_kind(kind)
    table = _ENTRIES[kind]
    if isinstance(name, str) and name in table:
        return table[name]
    raise ValueError(f"unknown {kind} {name!r}: use one of {', '.join(table)}{elsewhere(name, kind)}")


def elsewhere(name: object, kind: str) -> str:
    """``"; 'fox' is an attention mechanism and a model"`` where ``name`` is registered as other
    kinds than ``kind``; an empty string else. For the end of an error message."""
    others = [KINDS[k] for k in kinds_of(name) if k != kind] if isinstance(name, str) else []
    if not others:
        return ""
    return f"; {name!r} is {' and '.join(others)}"
