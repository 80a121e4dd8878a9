"""The positional mechanisms the studies compare, in one vocabulary.

A mechanism is a position name from :data:`POSITIONS`, optionally with SSMax (``"bam+ssmax"``), so a
result can be told apart as coming from the prior or from SSMax. Every study (``compare``, the
retrieval study, DNA) names its models this way, and :func:`mechanism_fields` turns a name into the
:class:`~priorattn.models.GPTConfig` fields that differ from the defaults.
"""

from __future__ import annotations

#: name -> (label, GPTConfig fields): the positional mechanisms of seed 003 Fig. 2 / App. F.4 and
#: seed 000 Fig. 3. ``local_rope`` needs a ``window``, which each study sets.
POSITIONS: dict[str, tuple[str, dict]] = {
    "nope": ("NoPE", dict(prior="uniform", encoding="none")),
    "rope": ("RoPE", dict(encoding="rope")),
    "alibi": ("ALiBi", dict(prior="alibi")),
    "bam": ("BAM", dict(prior="ggd")),  # GGD; seed 003's full BAM is "bam+ssmax"
    "goat": ("GOAT", dict(prior="goat")),
    "sinusoidal": ("Sinusoidal", dict(encoding="sinusoidal")),
    "local_rope": ("RoPE local", dict(encoding="local_rope")),
}
SSMAX = "+ssmax"
#: Every mechanism name: each position with and without SSMax.
MECHANISMS = tuple(m for p in POSITIONS for m in (p, p + SSMAX))


def split_mechanism(mechanism: str, positions=POSITIONS) -> tuple[str, bool]:
    """``("bam", True)`` for ``"bam+ssmax"``; a ValueError naming the known positions otherwise.
    ``positions`` is the table the name must come from (a study may add evaluation variants)."""
    position, ssmax = (mechanism[: -len(SSMAX)], True) if mechanism.endswith(SSMAX) else (mechanism, False)
    if position not in positions:
        raise ValueError(
            f"unknown mechanism {mechanism!r}: use one of {', '.join(positions)}, each optionally with "
            f"'{SSMAX}' (e.g. 'bam{SSMAX}')"
        )
    return position, ssmax


def mechanism_label(mechanism: str, positions=POSITIONS) -> str:
    """``"BAM + SSMax"`` for ``"bam+ssmax"``."""
    position, ssmax = split_mechanism(mechanism, positions)
    return positions[position][0] + (" + SSMax" if ssmax else "")


def mechanism_fields(mechanism: str, positions=POSITIONS) -> dict:
    """The GPTConfig fields of ``mechanism``: its position's, plus ``ssmax=True`` with SSMax."""
    position, ssmax = split_mechanism(mechanism, positions)
    return dict(positions[position][1], **({"ssmax": True} if ssmax else {}))
