"""A log-prior as a FlexAttention ``score_mod`` (``torch.nn.attention.flex_attention``).

FlexAttention calls ``score_mod(score, b, h, q_idx, kv_idx)`` at each (query, key) pair with the
scaled content score. A prior hands what it needs as :class:`ScoreTerms` (its value per lag, per key,
or per pair) and :func:`score_mod_of` adds them; the ``flex`` route of ``priorattn.attention`` builds
its ``score_mod`` with the same function, from a fold's key terms and slope or a lag table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from torch import Tensor

from ..checks import describe, is_integer_tensor

#: FlexAttention's ``score_mod``: ``(score, b, h, q_idx, kv_idx) -> score``.
ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


class ScoreTerms(NamedTuple):
    """A log-prior split into the parts a ``score_mod`` reads, at positions ``q_pos`` ``(B or 1, Lq)``
    and ``k_pos`` ``(B or 1, Lk)`` whose lags ``q_pos[b, i] - k_pos[b, j]`` lie in a run ``lags``
    ``(n,)``:

        K[b, h, i, j] = by_lag[h, lag - lags[0]] + by_key[b, h, j] + dense[b, h, i, j]

    - ``by_lag`` ``(H or 1, n)``: the part that depends on the lag alone (a relative prior; GOAT's
      spectral part and slope), at each of ``lags``.
    - ``by_key`` ``(B or 1, H or 1, Lk)``: the part that depends on the key alone (GOAT's sink).
    - ``dense`` ``(B or 1, H or 1, Lq, Lk)``: the rest, per pair (FIRE, which reads the query's
      position as well as the lag): ``Lq x Lk`` values per head, as the reference route holds.
    """

    by_lag: Tensor | None = None
    by_key: Tensor | None = None
    dense: Tensor | None = None


class RowCentre(NamedTuple):
    """A key bias less its value at each query row's own key, ``u_j - u_t``: a constant per row, which
    leaves the row's softmax as it was and keeps the near keys' terms small however far ``u`` has
    drifted (the ``flex`` route's key bias, ``functional.flex.row_centred_key_bias``).

    - ``own`` ``(B or 1, H or 1, Lq)``: ``u_t`` per query row.
    - ``rounding`` ``(B or 1, H or 1, Lk)`` and ``own_rounding`` ``(B or 1, H or 1, Lq)``: what
      rounding ``u`` to the score's dtype dropped, at the keys and at the rows' own keys (None: nothing).
    """

    own: Tensor
    rounding: Tensor | None = None
    own_rounding: Tensor | None = None


def at(t: Tensor, *index) -> Tensor:
    """``t[index]``, reading index 0 along each dimension of size 1 (a term shared by the batch or
    the heads): FlexAttention's indices run over the batch and heads of q."""
    return t[tuple(0 if size == 1 else i for size, i in zip(t.shape, index))]


def score_mod_of(
    q_pos: Tensor,
    k_pos: Tensor,
    *,
    key_bias: Tensor | None = None,
    slope: Tensor | None = None,
    table: Tensor | None = None,
    low: int = 0,
    dense: Tensor | None = None,
    row_factor: Tensor | None = None,
    row_centre: RowCentre | None = None,
) -> ScoreMod:
    """A ``score_mod`` adding, with ``i = q_idx``, ``j = kv_idx`` and ``lag = q_pos[b, i] - k_pos[b, j]``,

        f[b, h, i] (key_bias[b, h, j] - slope[h] lag + table[h, lag - low] + dense[b, h, i, j])

    to the score: ``f`` the ``row_factor`` ``(B or 1, H or 1, Lq, 1)`` (SSMax's factor, a prior's query
    gate; 1 without one), each term absent when None. Positions are ``(B or 1, L)`` integers; a term
    of size 1 along its batch or head dimension is shared along it. ``table`` ``(H or 1, n)`` holds
    lag ``low + c`` at column ``c`` and must cover every lag of the positions. The slope's term is
    formed in the score's dtype from an exact integer lag (the ALiBi lag form, exact at any position).
    With ``row_centre`` the key bias enters as ``(key_bias[j] - own[i]) + (rounding[j] -
    own_rounding[i])`` (:class:`RowCentre`): near keys' differences first, exact in the score's dtype.
    """

    def score_mod(score, b, h, q_idx, kv_idx):
        lag = at(q_pos, b, q_idx) - at(k_pos, b, kv_idx)
        bias = 0.0
        if key_bias is not None:  # GOAT's sink u_h(j) (seed 000 Eq. 19), the op's key bias
            term = at(key_bias, b, h, kv_idx)
            if row_centre is not None:
                term = term - at(row_centre.own, b, h, q_idx)
                if row_centre.rounding is not None:
                    term = term + (
                        at(row_centre.rounding, b, h, kv_idx) - at(row_centre.own_rounding, b, h, q_idx)
                    )
            bias = bias + term
        if slope is not None:  # -m_h (i - j), exact at any position
            bias = bias - at(slope, h) * lag.to(score.dtype)
        if table is not None:
            bias = bias + at(table, h, lag - low)
        if dense is not None:
            bias = bias + at(dense, b, h, q_idx, kv_idx)
        if row_factor is not None:  # SSMax's factor, a query gate
            bias = bias * at(row_factor, b, h, q_idx, 0)
        return score + bias

    return score_mod


def score_positions(q_pos: object, k_pos: object) -> tuple[Tensor, Tensor]:
    """``q_pos`` and ``k_pos`` (``k_pos`` None: ``q_pos``) as ``(B or 1, L)`` int64, each an integer
    tensor ``(L,)`` or ``(B, L)`` with ``L >= 1``, the two with one batch size where both have one."""
    k_pos = q_pos if k_pos is None else k_pos
    rows = {}
    for name, pos in (("q_pos", q_pos), ("k_pos", k_pos)):
        if not is_integer_tensor(pos) or pos.dim() not in (1, 2) or pos.shape[-1] < 1:
            raise ValueError(
                f"{name} must be an integer tensor (L,) or (B, L) with L >= 1, got {describe(pos)}"
            )
        rows[name] = pos.long().reshape(-1, pos.shape[-1])
    q_rows, k_rows = rows["q_pos"].shape[0], rows["k_pos"].shape[0]
    if q_rows != k_rows and min(q_rows, k_rows) > 1:
        raise ValueError(f"q_pos has {q_rows} rows but k_pos has {k_rows}: give one batch size, or (L,)")
    return rows["q_pos"], rows["k_pos"]


def check_gate_queries(q: object, num_heads: int | None, q_pos: Tensor) -> None:
    """``q`` for a query gate: a floating ``(B, H, Lq, D)`` tensor of the prior's heads and the
    positions' queries (and rows, where they have more than one)."""
    B, Lq = q_pos.shape
    fits = isinstance(q, Tensor) and q.is_floating_point() and q.dim() == 4
    if (
        not fits
        or q.shape[2] != Lq
        or (num_heads is not None and q.shape[1] != num_heads)
        or B not in (1, q.shape[0])
    ):
        heads = "H" if num_heads is None else num_heads
        raise ValueError(
            f"q must be a floating tensor (B, {heads}, {Lq}, D) matching q_pos, got {describe(q)}"
        )
