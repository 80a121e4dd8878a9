"""The positional mechanisms the studies compare, in one vocabulary.

A mechanism is a position name, optionally with SSMax (``"bam+ssmax"``), so a result can be told
apart as coming from the prior or from SSMax. The positions are :data:`POSITIONS` (priors,
encodings, and FoX's forget gate, an attention mechanism) and every prior registered by name
(:func:`positions`: a new prior file is a position of every study that reads them). Every study
(``compare``, the retrieval study, DNA) names its models this way, and :func:`mechanism_fields`
turns a name into the :class:`~priorattn.models.GPTConfig` fields that differ from the defaults.
"""

from __future__ import annotations

from ..priors import canonical_spec, names, registered

#: name -> (label, GPTConfig fields): the positional mechanisms of seed 003 Fig. 2 / App. F.4 and
#: seed 000 Fig. 3, and FoX. ``local_rope`` needs a ``window``, which each study sets.
POSITIONS: dict[str, tuple[str, dict]] = {
    "nope": ("NoPE", dict(prior="uniform", encoding="none")),
    "rope": ("RoPE", dict(encoding="rope")),
    "alibi": ("ALiBi", dict(prior="alibi")),
    "bam": ("BAM", dict(prior="ggd")),  # GGD; seed 003's full BAM is "bam+ssmax"
    "goat": ("GOAT", dict(prior="goat")),
    # GOAT's ablations: each is a spec of GOAT's options (priors/goat.py)
    "goat_noslope": ("GOAT no slope", dict(prior="goat(slope=none)")),
    "goat_nosink": ("GOAT no sink", dict(prior="goat(sink=none)")),
    "goat_spectral": ("GOAT spectral", dict(prior="goat(sink=none, slope=none)")),
    "goat_fixedslope": ("GOAT fixed slope", dict(prior="goat(slope=fixed)")),
    "goat_gate": ("GOAT gate", dict(prior="goat(gate=true)")),
    "goat_uniform": ("GOAT uniform start", dict(prior="goat(init=uniform)")),
    "sinusoidal": ("Sinusoidal", dict(encoding="sinusoidal")),
    "local_rope": ("RoPE local", dict(encoding="local_rope")),
    # the Forgetting Transformer (Lin et al. 2025): a data-dependent per-key decay, with no
    # positional encoding as in the paper (layers.ForgetGate)
    "fox": ("FoX", dict(attention="fox")),
}
SSMAX = "+ssmax"

#: How every figure draws a position: ``(colour, marker, line style)``, so a mechanism looks the
#: same in every study's figures. The mechanisms ``compare`` trains by default take the Okabe-Ito
#: colour-blind-safe palette (Okabe and Ito 2008), one colour each, with a marker each so that
#: overlapping lines stay apart; GOAT's ablations take colours of their own. Two names the studies
#: add to the vocabulary are drawn here too: the retrieval study's RoPE extensions (RoPE's model
#: scored with position interpolation, NTK-aware scaling, YaRN: dotted, PI in RoPE's colour) and the
#: vision study's ``learned`` absolute embeddings. :func:`mechanism_style` draws SSMax dashed and
#: the priors registered beyond these.
POSITION_STYLES: dict[str, tuple[str, str, str]] = {
    "nope": ("#000000", "o", "-"),
    "sinusoidal": ("#E69F00", "v", "-"),
    "rope": ("#0072B2", "s", "-"),
    "local_rope": ("#009E73", "D", "-"),
    "alibi": ("#56B4E9", "^", "-"),
    "bam": ("#D55E00", "P", "-"),
    "goat": ("#CC79A7", "*", "-"),
    "goat_noslope": ("#8C564B", "X", "-"),
    "goat_nosink": ("#7F7F7F", "p", "-"),
    "goat_spectral": ("#BCBD22", "h", "-"),
    "goat_fixedslope": ("#17BECF", "<", "-"),
    "goat_gate": ("#6A3D9A", ">", "-"),
    "goat_uniform": ("#E7298A", "d", "-"),
    "fox": ("#AA4499", "H", "-"),
    "rope_pi": ("#0072B2", "s", ":"),
    "rope_ntk": ("#332288", "s", ":"),
    "rope_yarn": ("#88CCEE", "s", ":"),
    "learned": ("#B8860B", "d", "-"),
}
#: The line style of a position with SSMax, for each style without it.
SSMAX_LINESTYLES = {"-": "--", ":": "-."}
#: Colours of the registered priors :data:`POSITION_STYLES` does not name, in registration order.
OTHER_COLOURS = ("#E41A1C", "#377EB8", "#4DAF4A", "#984EA3", "#FF7F00", "#A65628", "#F781BF", "#999999")


def positions() -> dict[str, tuple[str, dict]]:
    """:data:`POSITIONS`, then every prior registered now (:func:`priorattn.priors.names`) under its
    name, labelled by its class (``"GGD"``), as ``prior=name``."""
    registry = {name: (registered(name).cls.__name__, dict(prior=name)) for name in names()}
    return POSITIONS | {name: entry for name, entry in registry.items() if name not in POSITIONS}


def not_a_prior(name: str) -> dict | None:
    """The :class:`~priorattn.models.GPTConfig` fields of the position ``name`` where it is a
    mechanism but no prior (``"fox"``: ``{"attention": "fox"}``, ``"rope"``: ``{"encoding":
    "rope"}``), so a command given it as a prior can say what to give instead; ``None`` else."""
    if name not in POSITIONS or name in names():
        return None
    fields = POSITIONS[name][1]
    return None if "prior" in fields else dict(fields)


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
    for name, (_, fields) in positions().items():
        if set(fields) == {"prior"} and canonical_spec(fields["prior"]) == wanted:
            return name + ssmax
    return None


def mechanisms() -> tuple[str, ...]:
    """Every mechanism name: each of :func:`positions` with and without SSMax."""
    return tuple(m for p in positions() for m in (p, p + SSMAX))


def split_mechanism(mechanism: str, table: dict | None = None) -> tuple[str, bool]:
    """``("bam", True)`` for ``"bam+ssmax"``; a ValueError naming the known positions otherwise.
    ``table`` is the positions the name must come from (a study may add evaluation variants; default
    :func:`positions`)."""
    table = positions() if table is None else table
    position, ssmax = (mechanism[: -len(SSMAX)], True) if mechanism.endswith(SSMAX) else (mechanism, False)
    if position not in table:
        raise ValueError(
            f"unknown mechanism {mechanism!r}: use one of {', '.join(table)}, each optionally with "
            f"'{SSMAX}' (e.g. 'bam{SSMAX}')"
        )
    return position, ssmax


def mechanism_label(mechanism: str, table: dict | None = None) -> str:
    """``"BAM + SSMax"`` for ``"bam+ssmax"``."""
    table = positions() if table is None else table
    position, ssmax = split_mechanism(mechanism, table)
    return table[position][0] + (" + SSMax" if ssmax else "")


def mechanism_style(mechanism: str) -> dict:
    """How figures draw ``mechanism`` (any name of :func:`mechanisms`, a RoPE extension or ``learned``):
    matplotlib line keywords ``{"color", "marker", "linestyle"}``, the position's from
    :data:`POSITION_STYLES` and dashed (dash-dotted for a dotted one) with SSMax. A registered prior
    the table does not name is drawn dotted in a colour of :data:`OTHER_COLOURS`, its place among
    those priors picking the colour and, past the palette, a sparser dotting. Distinct mechanisms
    get distinct (colour, line style) pairs."""
    others = [name for name in positions() if name not in POSITION_STYLES]
    position, ssmax = split_mechanism(mechanism, dict.fromkeys([*POSITION_STYLES, *others]))
    if position in POSITION_STYLES:
        colour, marker, linestyle = POSITION_STYLES[position]
        return dict(
            color=colour, marker=marker, linestyle=SSMAX_LINESTYLES[linestyle] if ssmax else linestyle
        )
    round_, index = divmod(others.index(position), len(OTHER_COLOURS))
    gap = 1 + round_  # each round of the palette dots more sparsely
    linestyle = (0, (4, gap, 1, gap)) if ssmax else (0, (1, gap))
    return dict(color=OTHER_COLOURS[index], marker="o", linestyle=linestyle)


def mechanism_fields(mechanism: str, table: dict | None = None) -> dict:
    """The GPTConfig fields of ``mechanism``: its position's, plus ``ssmax=True`` with SSMax."""
    table = positions() if table is None else table
    position, ssmax = split_mechanism(mechanism, table)
    return dict(table[position][1], **({"ssmax": True} if ssmax else {}))
