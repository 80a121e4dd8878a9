"""The named models the studies compare: the ``"model"`` kind of :mod:`priorattn.registry`.

A named model is the :class:`~priorattn.models.GPTConfig` fields that make it (:data:`NAMED_MODELS`:
NoPE, RoPE, BAM, GOAT and its ablations, sinusoids, local RoPE, FoX). With every prior registered by
name (``prior=name``: a new prior file is a model of every study), they are the *positions* a study
compares (:func:`positions`), and a position optionally with SSMax (``"bam+ssmax"``) is a
*mechanism*, so a result can be told apart as coming from the prior or from SSMax. Every study
(``compare``, the retrieval study, DNA) names its models this way, and :func:`mechanism_fields`
turns a name into the fields that differ from the defaults. How the studies label and draw each one
is theirs (:mod:`priorattn.studies.styles`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from types import MappingProxyType

from .. import registry
from ..priors import canonical_spec, names

#: name -> GPTConfig fields: the positional mechanisms of seed 003 Fig. 2 / App. F.4 and seed 000
#: Fig. 3, and FoX. ``local_rope`` needs a ``window``, which each study sets.
NAMED_MODELS: dict[str, dict] = {
    "nope": dict(prior="uniform", encoding="none"),
    "rope": dict(encoding="rope"),
    "alibi": dict(prior="alibi"),
    "bam": dict(prior="ggd"),  # GGD; seed 003's full BAM is "bam+ssmax"
    "goat": dict(prior="goat"),
    # GOAT's ablations: each is a spec of GOAT's options (priors/goat.py)
    "goat_noslope": dict(prior="goat(slope=none)"),
    "goat_nosink": dict(prior="goat(sink=none)"),
    "goat_spectral": dict(prior="goat(sink=none, slope=none)"),
    "goat_fixedslope": dict(prior="goat(slope=fixed)"),
    "goat_gate": dict(prior="goat(gate=true)"),
    "goat_uniform": dict(prior="goat(init=uniform)"),
    "sinusoidal": dict(encoding="sinusoidal"),
    "local_rope": dict(encoding="local_rope"),
    # the Forgetting Transformer (Lin et al. 2025): a data-dependent per-key decay, with no
    # positional encoding as in the paper (layers.ForgetGate)
    "fox": dict(attention="fox"),
}
SSMAX = "+ssmax"

for _name, _fields in NAMED_MODELS.items():
    registry.register("model", _name, MappingProxyType(_fields))


def positions() -> dict[str, Mapping]:
    """Every named model's fields, then every prior registered now (:func:`priorattn.priors.names`)
    that names no model, as ``prior=name``."""
    models = dict(registry.entries("model"))
    return models | {name: {"prior": name} for name in names() if name not in models}


def prior_of_model(name: str) -> str | None:
    """The prior spec of the named model ``name`` where the model is that prior alone, with every
    other field at its default (``"bam"``: ``"ggd"``, ``"nope"``: ``"uniform"``, ``"goat_noslope"``:
    ``"goat(slope=none)"``), so a command or config given a model's name as a prior builds that
    model; ``None`` for any other name."""
    fields = dict(registry.entries("model").get(name, {}))
    if fields.pop("encoding", "none") != "none" or set(fields) != {"prior"}:
        return None
    return fields["prior"]


def not_a_prior(name: str) -> dict | None:
    """The fields of the named model ``name`` where it is a model but no prior (``"fox"``:
    ``{"attention": "fox"}``, ``"rope"``: ``{"encoding": "rope"}``), so a command given it as a prior
    can say what to give instead; ``None`` else."""
    fields = registry.entries("model").get(name)
    if fields is None or name in names() or prior_of_model(name) is not None:
        return None
    return dict(fields)


def mechanism_of_spec(spec: str) -> str | None:
    """The mechanism whose model is the prior ``spec`` (optionally ``+ssmax``), named as the studies
    name it: ``"goat(slope=none)"`` is ``"goat_noslope"``, ``"ggd+ssmax"`` is ``"bam+ssmax"``;
    ``None`` where no position is that prior alone or ``spec`` is no valid spec. Specs are compared
    in their canonical form, so option order and defaults do not matter."""
    prior, ssmax = (spec[: -len(SSMAX)], SSMAX) if spec.endswith(SSMAX) else (spec, "")
    try:
        wanted = canonical_spec(prior)
    except ValueError:
        return None
    for name, fields in positions().items():
        if set(fields) == {"prior"} and canonical_spec(fields["prior"]) == wanted:
            return name + ssmax
    return None


def mechanisms() -> tuple[str, ...]:
    """Every mechanism name: each of :func:`positions` with and without SSMax."""
    return tuple(m for p in positions() for m in (p, p + SSMAX))


def split_mechanism(mechanism: str, known: Collection[str] | None = None) -> tuple[str, bool]:
    """``("bam", True)`` for ``"bam+ssmax"``; a ValueError naming the known positions otherwise.
    ``known`` is the positions the name must come from (a study may add evaluation variants; default
    :func:`positions`)."""
    known = positions() if known is None else known
    position, ssmax = (mechanism[: -len(SSMAX)], True) if mechanism.endswith(SSMAX) else (mechanism, False)
    if position not in known:
        raise ValueError(
            f"unknown mechanism {mechanism!r}: use one of {', '.join(known)}, each optionally with "
            f"'{SSMAX}' (e.g. 'bam{SSMAX}')"
        )
    return position, ssmax


def mechanism_fields(mechanism: str, table: Mapping[str, Mapping] | None = None) -> dict:
    """The GPTConfig fields of ``mechanism``: its position's, plus ``ssmax=True`` with SSMax.
    ``table`` maps positions to their fields (default :func:`positions`)."""
    table = positions() if table is None else table
    position, ssmax = split_mechanism(mechanism, table)
    return dict(table[position], **({"ssmax": True} if ssmax else {}))
