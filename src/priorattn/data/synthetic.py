"""Synthetic retrieval over a small vocabulary: sequences a tiny GPT trains on directly, with no text.

Every sequence is ``START``, then i.i.d. filler tokens (the haystack) holding one or more needles,
then a query part that begins with ``QUERY`` and ends with the answer. The loss and the score are taken
on the answer tokens only (``answer_mask``). Three tasks, shown with ``values=2`` (``S`` start, ``N``
needle marker, ``Q`` query marker, ``f`` filler, ``a b c`` keys, digits values):

- ``passkey`` (Mohtashami & Jaggi 2023; seed 003 Sec. 3.1): one needle ``N v1..vk`` in the filler,
  then ``Q N v1..vk``; the answer is ``v1..vk``::

      S f f N 7 3 f f f Q N 7 3                      answers: 7 3

- ``mqar``, multi-query associative recall (Arora et al. 2023, "Zoology"): a block of ``pairs``
  distinct keys, each followed by its ``values`` value tokens, at ``depth`` of the filler; then ``Q``
  and every key again in a random order, each followed by its values (all of them answers)::

      S f a 4 1 b 9 0 f f Q b 9 0 a 4 1              answers: 9 0 4 1

- ``niah``, multi-key needle in a haystack with distractors (RULER, as in seed 003 App. E and seed 000
  Fig. 3c): ``needles`` needles ``N key v1..vk`` with distinct keys, the asked one (needle 0) at
  ``depth`` and the distractors at uniformly random depths; then ``Q key_0 v1..vk``::

      S f N b 5 2 f N a 8 6 f Q a 8 6                answers: 8 6

The layout makes every answer token one attention hop for a model with a token shift
(``h_t = e_t + W e_{t-1}``): the token before an answer token occurs exactly once earlier in the
sequence, right before the same token in the needle. The first value follows ``N`` (passkey) or the
key in the needle and in the query alike, and a later value follows the value before it, which is
unique in the sample because **all value tokens of a sample are distinct** (drawn without
replacement). I.i.d. values would repeat (with 10 digits, two of four coincide in 1 - 10*9*8*7/10^4
= 0.496 of the passkeys) and the token before a value would then point at two places: a second hop
would be needed.

Vocabulary, one layout for every task (:data:`SYNTHETIC_VOCAB_SIZE` = 63 tokens): 0 ``START``,
1 ``NEEDLE``, 2 ``QUERY``, 3-14 filler (12 kinds), 15-38 keys (24), 39-62 values (24). Filler never
holds a marker, key or value. So a sample has at most 24 keys (``pairs``, ``needles``) and 24 value
tokens (``pairs * values``, ``needles * values``).

``depth`` places the (asked) needle in the filler: it lies after exactly ``round(depth * F)`` of the
``F`` filler tokens (Python's ``round``), so depth 0 is right after ``START`` and depth 1 right before
``QUERY``. A niah distractor drawn into the same gap goes after the asked needle when depth <= 1/2 and
before it otherwise, which keeps those two ends exact. A sample is a pure function of the generator's
state.

Chance level of exact match (every answer token of a sample right), for a guess that does not read
the haystack: the answer is an ordered draw of distinct values, so 1 / (24 * 23 * ... * (24 - n + 1))
for ``n`` answer tokens: about 4e-6 for the passkey and niah at the defaults (``n = 4``), per mqar
query as well, and 8!/24! ~ 6.5e-20 for a whole mqar sample (``n = 16``). A model that reads the
values of some needle but cannot tell which one is asked scores ``1 / needles`` on niah (0.25 at the
defaults) and ``1 / pairs`` per mqar query.
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np
import torch
from torch import Tensor

from .packing import IGNORE_INDEX

SYNTHETIC_TASKS = ("passkey", "mqar", "niah")
START_TOKEN, NEEDLE_TOKEN, QUERY_TOKEN = 0, 1, 2
FILLER_TOKENS = range(3, 15)
KEY_TOKENS = range(15, 39)
VALUE_TOKENS = range(39, 63)
SYNTHETIC_VOCAB_SIZE = 63


@dataclass(frozen=True)
class SyntheticSample:
    """One sequence with its answers marked.

    ``tokens: (L,)`` int64, the whole sequence with the answers. ``answer_mask: (L,)`` bool, True at every
    answer token (never at index 0). ``needle_starts``: the index of each needle's first token; the
    asked needle first, then the distractors in sequence order (niah); for mqar the first token (the
    key) of each pair in the order the queries ask them. ``depth``: where the (asked) needle was put.
    """

    tokens: np.ndarray
    answer_mask: np.ndarray
    needle_starts: tuple[int, ...]
    depth: float


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


class SyntheticTask:
    """One of :data:`SYNTHETIC_TASKS` (see the module docstring) and its sequences.

    ``values``: value tokens per answer (the passkey's digits, the value after a key). ``pairs``: mqar
    key-value pairs, all queried. ``needles``: niah needles, one asked and the rest distractors.
    Each is checked for every task; a task ignores the counts of the others.
    """

    def __init__(self, name: str, *, values: int = 4, pairs: int = 4, needles: int = 4):
        if name not in SYNTHETIC_TASKS:
            raise ValueError(f"name must be one of {SYNTHETIC_TASKS}, got {name!r}")
        self.name = name
        self.values = _check_int("values", values, 1)
        self.pairs = _check_int("pairs", pairs, 1)
        self.needles = _check_int("needles", needles, 2)
        if name == "passkey":
            count, what = 1, "values"
        else:
            count, what = (self.pairs, "pairs") if name == "mqar" else (self.needles, "needles")
            if count > len(KEY_TOKENS):
                raise ValueError(f"{what} must be at most {len(KEY_TOKENS)} (the key tokens), got {count}")
            what = f"{what} * values"
        if count * self.values > len(VALUE_TOKENS):
            raise ValueError(
                f"{what} must be at most {len(VALUE_TOKENS)} (a sample's values are distinct value "
                f"tokens), got {count * self.values}"
            )

    @property
    def vocab_size(self) -> int:
        return SYNTHETIC_VOCAB_SIZE

    def min_length(self) -> int:
        """The shortest sequence this task builds: start, needles and query part, no filler."""
        k = self.values
        if self.name == "passkey":
            return 1 + (1 + k) + (2 + k)  # S | N v.. | Q N v..
        if self.name == "mqar":
            return 1 + self.pairs * (1 + k) + 1 + self.pairs * (1 + k)  # S | (key v..)* | Q (key v..)*
        return 1 + self.needles * (2 + k) + (2 + k)  # S | (N key v..)* | Q key v..

    def answer_length(self) -> int:
        """Answer tokens per sample."""
        return self.pairs * self.values if self.name == "mqar" else self.values

    def _parts(self, rng: np.random.Generator) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
        """``(needles, query, asked)``: the needles to hide (needle 0 goes at ``depth``), the query part,
        and the offsets into needle 0 of the needle starts to report (mqar: each pair, in query order)."""
        k = self.values
        if self.name == "passkey":
            values = rng.choice(VALUE_TOKENS, k, replace=False)
            needle = np.concatenate([[NEEDLE_TOKEN], values])
            return [needle], np.concatenate([[QUERY_TOKEN, NEEDLE_TOKEN], values]), np.zeros(1, np.int64)
        count = self.pairs if self.name == "mqar" else self.needles
        keys = rng.choice(KEY_TOKENS, count, replace=False)  # (count,)
        values = rng.choice(VALUE_TOKENS, count * k, replace=False).reshape(count, k)
        pairs = np.concatenate([keys[:, None], values], axis=1)  # (count, 1 + k): key v..
        if self.name == "mqar":
            order = rng.permutation(count)
            query = np.concatenate([[QUERY_TOKEN], pairs[order].reshape(-1)])
            return [pairs.reshape(-1)], query, order * (1 + k)
        needles = [np.concatenate([[NEEDLE_TOKEN], pair]) for pair in pairs]
        return needles, np.concatenate([[QUERY_TOKEN], pairs[0]]), np.zeros(1, np.int64)

    def sample(self, length: int, depth: float, rng: np.random.Generator) -> SyntheticSample:
        """A sequence of exactly ``length`` tokens with the (asked) needle at ``depth`` of the filler.

        Raises ``ValueError`` when ``length`` is below :meth:`min_length` or ``depth`` is not in [0, 1].
        """
        if isinstance(length, bool) or not isinstance(length, Integral) or length < self.min_length():
            raise ValueError(
                f"length must be an int >= {self.min_length()} (the {self.name} task's min_length), "
                f"got {length!r}"
            )
        if isinstance(depth, bool) or not isinstance(depth, Real) or not 0.0 <= depth <= 1.0:
            raise ValueError(f"depth must be a number in [0, 1], got {depth!r}")
        needles, query, asked = self._parts(rng)
        n_filler = int(length) - self.min_length()
        filler = rng.integers(FILLER_TOKENS.start, FILLER_TOKENS.stop, n_filler)  # (n_filler,)
        cuts = [round(depth * n_filler)] + rng.integers(0, n_filler + 1, len(needles) - 1).tolist()
        # Ties with the asked needle (rank 1) put it nearer its own end: depth 0 right after START,
        # depth 1 right before QUERY.
        ranks = [1] + [2 if depth <= 0.5 else 0] * (len(needles) - 1)
        order = sorted(range(len(needles)), key=lambda i: (cuts[i], ranks[i], i))
        pieces, starts, done, at = [np.array([START_TOKEN])], {}, 0, 1
        for i in order:
            pieces += [filler[done : cuts[i]], needles[i]]
            at += cuts[i] - done
            starts[i], done, at = at, cuts[i], at + len(needles[i])
        pieces += [filler[done:], query]
        tokens = np.concatenate(pieces).astype(np.int64)  # (length,)
        answer_mask = np.zeros(length, dtype=bool)
        answer_mask[-len(query) :] = query >= VALUE_TOKENS.start  # the values in the query part
        needle_starts = [starts[0] + int(offset) for offset in asked]
        needle_starts += [starts[i] for i in order if i != 0]
        return SyntheticSample(tokens, answer_mask, tuple(needle_starts), float(depth))

    def batch(
        self, batch_size: int, length: int, rng: np.random.Generator, depth: float | None = None
    ) -> tuple[Tensor, Tensor]:
        """``batch_size`` samples as ``(inputs, targets)``, both int64 ``(B, length - 1)``.

        ``inputs`` is ``tokens[:-1]``; ``targets`` is ``tokens[1:]`` at answer tokens and
        ``IGNORE_INDEX`` (-100) everywhere else. Row ``b`` is :meth:`sample` with ``rng`` as the rows
        before left it; with ``depth=None`` each row first draws its depth, ``rng.random()``.
        """
        batch_size = _check_int("batch_size", batch_size, 1)
        rows = [self.sample(length, rng.random() if depth is None else depth, rng) for _ in range(batch_size)]
        tokens = torch.from_numpy(np.stack([row.tokens for row in rows]))  # (B, length)
        answers = torch.from_numpy(np.stack([row.answer_mask for row in rows]))  # (B, length)
        targets = tokens[:, 1:].masked_fill(~answers[:, 1:], IGNORE_INDEX)
        return tokens[:, :-1], targets


def training_lengths(max_len: int, min_len: int, rng: np.random.Generator) -> int:
    """One training length drawn uniformly from ``[min_len, max_len]`` (both included)."""
    min_len = _check_int("min_len", min_len, 1)
    max_len = _check_int("max_len", max_len, 1)
    if max_len < min_len:
        raise ValueError(f"max_len must be at least min_len = {min_len}, got {max_len}")
    return int(rng.integers(min_len, max_len + 1))
