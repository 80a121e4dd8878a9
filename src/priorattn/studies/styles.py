"""How the studies name and draw each model, so a mechanism reads and looks the same in every
study's tables and figures.

A mechanism is a position (a named model of :mod:`priorattn.models.named`, a registered prior,
or a study's own evaluation variant) optionally with SSMax. :func:`mechanism_label` gives its name
in words (:data:`LABELS`, a registered prior its class's name) and :func:`mechanism_style` its
matplotlib line style (:data:`POSITION_STYLES`). Shared by every study, and no study itself.
"""

from __future__ import annotations

from ..models.named import positions, split_mechanism
from ..priors import names, registered

#: Each position's name in tables and legends. Besides the named models: the retrieval study's RoPE
#: extensions (RoPE's model scored with position interpolation, NTK-aware scaling, YaRN) and the
#: vision study's ``learned`` absolute embeddings.
LABELS = {
    "nope": "NoPE",
    "rope": "RoPE",
    "alibi": "ALiBi",
    "bam": "BAM",
    "goat": "GOAT",
    "goat_noslope": "GOAT no slope",
    "goat_nosink": "GOAT no sink",
    "goat_spectral": "GOAT spectral",
    "goat_fixedslope": "GOAT fixed slope",
    "goat_gate": "GOAT gate",
    "goat_uniform": "GOAT uniform start",
    "sinusoidal": "Sinusoidal",
    "local_rope": "RoPE local",
    "fox": "FoX",
    "rope_pi": "RoPE PI",
    "rope_ntk": "RoPE NTK",
    "rope_yarn": "RoPE YaRN",
    "learned": "Learned",
}

#: How every figure draws a position: ``(colour, marker, line style)``. The mechanisms ``compare``
#: trains by default take the Okabe-Ito colour-blind-safe palette (Okabe and Ito 2008), one colour
#: each, with a marker each so that overlapping lines stay apart; GOAT's ablations take colours of
#: their own; RoPE's extensions are dotted, PI in RoPE's colour. :func:`mechanism_style` draws SSMax
#: dashed and the priors registered beyond these.
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


def mechanism_label(mechanism: str) -> str:
    """``"BAM + SSMax"`` for ``"bam+ssmax"``: the position's :data:`LABELS` entry, or a registered
    prior's class name (``"GGD"``); a ValueError naming the known positions for any other name."""
    position, ssmax = split_mechanism(mechanism, dict.fromkeys([*positions(), *LABELS]))
    label = LABELS.get(position) or (registered(position).cls.__name__ if position in names() else position)
    return label + (" + SSMax" if ssmax else "")


def mechanism_style(mechanism: str) -> dict:
    """How figures draw ``mechanism`` (a position of :func:`~priorattn.models.named.positions`
    or :data:`LABELS`, optionally with SSMax): matplotlib line keywords ``{"color", "marker",
    "linestyle"}``, the position's from :data:`POSITION_STYLES` and dashed (dash-dotted for a dotted
    one) with SSMax. A registered prior the table does not name is drawn dotted in a colour of
    :data:`OTHER_COLOURS`, its place among those priors picking the colour and, past the palette, a
    sparser dotting. Distinct mechanisms get distinct (colour, line style) pairs."""
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
