"""Synthetic retrieval over a small vocabulary: sequences a tiny GPT trains on directly.

Every sequence is ``START``, then a haystack holding one or more needles, then a query part that
begins with ``QUERY`` and ends with the answer. The score is taken on the answer tokens only
(``answer_mask``); so is the loss, except in ``text_passkey``, which has the loss on every token
(``loss_mask``). The tasks, shown with ``values=2`` (``S`` start, ``N`` needle marker, ``Q`` query
marker, ``f`` filler, ``a b c`` keys, digits values):

**Content tasks** (:data:`CONTENT_TASKS`): the answer is found by content alone.

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

**Position tasks** (:data:`POSITION_TASKS`): what each tests, and why content alone cannot pass it.

- ``text_passkey``, needles in natural text: the passkey, with the haystack a window of real text
  (:func:`text_tokens`: the embedded Shakespeare, lower-cased, one token per character) and the
  loss on every token, so a model trained on it is a language model of the text that also
  retrieves, as the seeds' models are. It tests whether retrieval survives beyond ``T`` in a model
  that must use positions to model text (local order); the retrieval itself is one content match.
  Control: the values never occur in the text and are drawn afresh for each sample, so a model of
  the text that does not read the needle scores the passkey's chance level.
- ``latest`` and ``first``, order-sensitive recall: one key assigned ``needles`` times, each time
  to other values (``N a v1..vk``); the question ``Q a`` asks for the latest values, ``Q S a`` (the
  start marker: "counting from the start") for the first, so that a model trained on both can tell
  which is asked.
  The answer's needle lies at ``depth`` and the other assignments before it (``latest``: uniformly
  in ``[0, depth]``) or after it (``first``: in ``[depth, 1]``), so ``latest`` sets a near
  assignment against a far one and ``first`` a far one against near ones: where a prior's shape
  decides. Control: every assignment matches the key, so a reader without order picks one of
  ``needles``::

      S f N a 5 2 f N a 8 6 f Q a 8 6                latest: 8 6   (first: Q S a 5 2)

- ``offset``, positional recall: a needle ``N v1..vk`` and the question ``Q N``, whose answer is
  the one value ``offset`` tokens after the marker, ``v_offset``. Control: content leads from ``N``
  to ``v1`` only; reaching ``v_offset`` needs its distance from the marker (or ``offset - 1``
  further content hops, one per layer)::

      S f f N 7 3 9 f f Q N 9                        offset 3: answer 9

- ``span``, a span copied in order: a needle ``N s1..sm`` of ``span`` tokens drawn from three
  value tokens, with repeats, and the question ``Q N s1..sm`` (every ``s`` an answer). A span is
  drawn again until it uses all three tokens and some pair of neighbours recurs with different
  successors, so that copying it needs the place in the span, not only the last two tokens::

      S f N 7 7 3 7 7 9 f Q N 7 7 3 7 7 9            answers: 7 7 3 7 7 9

A task's control is :func:`content_answers`: a reader that matches the last one or two tokens (two
with a token shift, whose ``h_t = e_t + W e_{t-1}`` makes a pair of tokens one key) against the
sequence before and reads what follows, right only where every match agrees. It answers every
content task exactly and no ``latest``, ``first``, ``offset`` or ``span`` sample
(``test_position_tasks_fail_the_content_reader``). For the content tasks it is one attention hop:
the token before an answer token occurs exactly once earlier, right before the same token in the
needle, because **all value tokens of a sample are distinct** (drawn without replacement; the
span's are not, on purpose). I.i.d. values would repeat (with 10 digits, two of four coincide in
1 - 10*9*8*7/10^4 = 0.496 of the passkeys) and the token before a value would then point at two
places: a second hop would be needed.

Vocabulary, one layout for every task: 0 ``START``, 1 ``NEEDLE``, 2 ``QUERY``, 3-14 filler (12
kinds), 15-38 keys (24), 39-62 values (24) (:data:`SYNTHETIC_VOCAB_SIZE` = 63 tokens); the text
characters :data:`TEXT_CHARS` follow as 63-98 (:data:`TEXT_VOCAB_SIZE` = 99, ``text_passkey``'s
vocabulary). Filler and text never hold a marker, key or value. So a sample has at most 24 keys
(``pairs``, ``needles``) and 24 value tokens (``pairs * values``, ``needles * values``).

``depth`` places the (asked) needle in the haystack: it lies after exactly ``round(depth * F)`` of
the ``F`` haystack tokens (Python's ``round``), so depth 0 is right after ``START`` and depth 1 right
before ``QUERY``. A niah distractor drawn into the same gap goes after the asked needle when depth <=
1/2 and before it otherwise, which keeps those two ends exact; a ``latest`` assignment in the same
gap goes before it and a ``first`` one after it. A sample is a pure function of the generator's
state.

Chance level of exact match (every answer token of a sample right) for the best guess that does not
read the haystack, :meth:`SyntheticTask.chance`: the values are an ordered draw of distinct tokens,
so ``1 / (24 * 23 * ... * (24 - n + 1))`` for ``n`` answer values: about 4e-6 for ``passkey``,
``text_passkey``, ``niah``, ``latest`` and ``first`` at the defaults (``n = 4``), per mqar query as
well, 8!/24! ~ 6.5e-20 for a whole mqar sample (``n = 16``), 1/24 for ``offset``; for ``span``, one
over the number of its spans (``C(24, 3)`` alphabets times the spans each allows: 5364 of the 3^8
at ``span = 8``). A model that reads the needles but cannot tell which is asked scores ``1 /
needles`` on niah, ``latest`` and ``first`` (0.25 at the defaults) and ``1 / pairs`` per mqar
query; one that reads the offset needle's values but not their order, ``1 / values`` (0.25).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import cache
from numbers import Integral, Real

import numpy as np
import torch
from torch import Tensor

from .corpus import load_corpus
from .packing import IGNORE_INDEX

CONTENT_TASKS = ("passkey", "mqar", "niah")
POSITION_TASKS = ("text_passkey", "latest", "first", "offset", "span")
SYNTHETIC_TASKS = CONTENT_TASKS + POSITION_TASKS
START_TOKEN, NEEDLE_TOKEN, QUERY_TOKEN = 0, 1, 2
FILLER_TOKENS = range(3, 15)
KEY_TOKENS = range(15, 39)
VALUE_TOKENS = range(39, 63)
SYNTHETIC_VOCAB_SIZE = 63
#: The characters of ``text_passkey``'s haystack, tokens 63.. in this order; the corpus is
#: lower-cased and every other character dropped.
TEXT_CHARS = "abcdefghijklmnopqrstuvwxyz \n.,;:'?!-"
TEXT_TOKENS = range(SYNTHETIC_VOCAB_SIZE, SYNTHETIC_VOCAB_SIZE + len(TEXT_CHARS))
TEXT_VOCAB_SIZE = TEXT_TOKENS.stop
SPAN_ALPHABET = 3  # value tokens a span is drawn from: few enough that neighbours recur


@dataclass(frozen=True)
class SyntheticSample:
    """One sequence with its answers marked.

    ``tokens: (L,)`` int64, the whole sequence with the answers. ``answer_mask: (L,)`` bool, True at every
    answer token (never at index 0). ``loss_mask: (L,)`` bool, the tokens trained on: every token but
    the first for ``text_passkey``, the answers otherwise. ``needle_starts``: the index of each
    needle's first token; the asked needle first, then the others in sequence order (niah, latest,
    first); for mqar the first token (the key) of each pair in the order the queries ask them.
    ``depth``: where the (asked) needle was put.
    """

    tokens: np.ndarray
    answer_mask: np.ndarray
    loss_mask: np.ndarray
    needle_starts: tuple[int, ...]
    depth: float


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


@cache
def text_tokens() -> np.ndarray:
    """The embedded corpus (:func:`~priorattn.data.corpus.load_corpus`'s default, every work in name
    order) as one text: lower-cased, characters outside :data:`TEXT_CHARS` dropped, each character
    its token in :data:`TEXT_TOKENS`. ``(N,)`` int64."""
    text = "".join(document.read() for document in load_corpus()).lower().encode("ascii", "ignore")
    table = np.full(256, -1, dtype=np.int64)
    table[[ord(c) for c in TEXT_CHARS]] = np.asarray(TEXT_TOKENS)
    tokens = table[np.frombuffer(text, dtype=np.uint8)]
    return tokens[tokens >= 0]


@cache
def span_count(span: int) -> int:
    """How many spans of ``span`` tokens over one alphabet of :data:`SPAN_ALPHABET` tokens
    :meth:`SyntheticTask.sample` allows: those that use every token and fail the content reader."""
    spans = itertools.product(VALUE_TOKENS[:SPAN_ALPHABET], repeat=span)
    return sum(len(set(s)) == SPAN_ALPHABET and not copied_by_content(np.array(s)) for s in spans)


def copied_by_content(span: np.ndarray) -> bool:
    """Whether :func:`content_answers` with a token shift's context copies ``span: (m,)`` from the
    needle ``N span`` after the question ``Q N``."""
    tokens = np.concatenate([[NEEDLE_TOKEN], span, [QUERY_TOKEN, NEEDLE_TOKEN], span])
    answer_mask = np.arange(len(tokens)) >= len(tokens) - len(span)
    return content_answers(tokens, answer_mask, context=2)


class SyntheticTask:
    """One of :data:`SYNTHETIC_TASKS` (see the module docstring) and its sequences.

    ``values``: value tokens per answer (the passkey's digits, the value after a key; the offset
    needle's values). ``pairs``: mqar key-value pairs, all queried. ``needles``: niah needles, one
    asked and the rest distractors; the assignments of ``latest`` and ``first``. ``offset``: which
    of the offset needle's values is asked, 2 .. ``values`` (1 would be the passkey's first value).
    ``span``: the span's length. Each is checked for every task; a task ignores the counts of the
    others.
    """

    def __init__(
        self, name: str, *, values: int = 4, pairs: int = 4, needles: int = 4, offset: int = 3, span: int = 8
    ):
        if name not in SYNTHETIC_TASKS:
            raise ValueError(f"name must be one of {SYNTHETIC_TASKS}, got {name!r}")
        self.name = name
        self.values = _check_int("values", values, 1)
        self.pairs = _check_int("pairs", pairs, 1)
        self.needles = _check_int("needles", needles, 2)
        self.offset = _check_int("offset", offset, 2)
        self.span = _check_int("span", span, 5)  # every shorter span is copied by content
        if name == "offset" and self.offset > self.values:
            raise ValueError(f"offset must be at most values = {self.values}, got {self.offset}")
        if name in ("passkey", "text_passkey", "offset"):
            count, what = 1, "values"
        elif name == "mqar":
            count, what = self.pairs, "pairs"
        else:
            count, what = self.needles, "needles"
        if count > len(KEY_TOKENS):
            raise ValueError(f"{what} must be at most {len(KEY_TOKENS)} (the key tokens), got {count}")
        if count * self.values > len(VALUE_TOKENS):
            what = what if count == 1 else f"{what} * values"
            raise ValueError(
                f"{what} must be at most {len(VALUE_TOKENS)} (a sample's values are distinct value "
                f"tokens), got {count * self.values}"
            )

    @property
    def vocab_size(self) -> int:
        return TEXT_VOCAB_SIZE if self.name == "text_passkey" else SYNTHETIC_VOCAB_SIZE

    def min_length(self) -> int:
        """The shortest sequence this task builds: start, needles and query part, no haystack."""
        k = self.values
        if self.name in ("passkey", "text_passkey"):
            return 1 + (1 + k) + (2 + k)  # S | N v.. | Q N v..
        if self.name == "offset":
            return 1 + (1 + k) + 3  # S | N v.. | Q N v
        if self.name == "span":
            return 1 + (1 + self.span) + (2 + self.span)  # S | N s.. | Q N s..
        if self.name == "mqar":
            return 1 + self.pairs * (1 + k) + 1 + self.pairs * (1 + k)  # S | (key v..)* | Q (key v..)*
        if self.name == "first":
            return 1 + self.needles * (2 + k) + (3 + k)  # S | (N key v..)* | Q S key v..
        return 1 + self.needles * (2 + k) + (2 + k)  # S | (N key v..)* | Q key v..

    def answer_length(self) -> int:
        """Answer tokens per sample."""
        return {"mqar": self.pairs * self.values, "offset": 1, "span": self.span}.get(self.name, self.values)

    def chance(self) -> float:
        """Exact match of the best guess that does not read the haystack (the module docstring)."""
        if self.name == "span":
            return 1 / (math.comb(len(VALUE_TOKENS), SPAN_ALPHABET) * span_count(self.span))
        return 1 / math.perm(len(VALUE_TOKENS), self.answer_length())

    def _parts(self, rng: np.random.Generator) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
        """``(needles, query, asked)``: the needles to hide (needle 0 goes at ``depth``), the query part,
        and the offsets into needle 0 of the needle starts to report (mqar: each pair, in query order)."""
        k = self.values
        if self.name in ("passkey", "text_passkey", "offset"):
            values = rng.choice(VALUE_TOKENS, k, replace=False)
            needle = np.concatenate([[NEEDLE_TOKEN], values])
            asked = values if self.name != "offset" else values[self.offset - 1 : self.offset]
            return [needle], np.concatenate([[QUERY_TOKEN, NEEDLE_TOKEN], asked]), np.zeros(1, np.int64)
        if self.name == "span":
            return (
                [needle := self._span_needle(rng)],
                np.concatenate([[QUERY_TOKEN], needle]),
                np.zeros(1, np.int64),
            )
        count = self.pairs if self.name == "mqar" else self.needles
        if self.name in ("latest", "first"):
            keys = np.repeat(rng.choice(KEY_TOKENS), count)  # one key, assigned count times
        else:
            keys = rng.choice(KEY_TOKENS, count, replace=False)  # (count,)
        values = rng.choice(VALUE_TOKENS, count * k, replace=False).reshape(count, k)
        pairs = np.concatenate([keys[:, None], values], axis=1)  # (count, 1 + k): key v..
        if self.name == "mqar":
            order = rng.permutation(count)
            query = np.concatenate([[QUERY_TOKEN], pairs[order].reshape(-1)])
            return [pairs.reshape(-1)], query, order * (1 + k)
        needles = [np.concatenate([[NEEDLE_TOKEN], pair]) for pair in pairs]
        asks = [QUERY_TOKEN, START_TOKEN] if self.name == "first" else [QUERY_TOKEN]
        return needles, np.concatenate([asks, pairs[0]]), np.zeros(1, np.int64)

    def _span_needle(self, rng: np.random.Generator) -> np.ndarray:
        """``N s1..sm``: a span over a fresh alphabet, drawn again until :func:`span_count` counts it."""
        alphabet = rng.choice(VALUE_TOKENS, SPAN_ALPHABET, replace=False)
        while True:
            span = alphabet[rng.integers(0, SPAN_ALPHABET, self.span)]  # (span,)
            if len(set(span.tolist())) == SPAN_ALPHABET and not copied_by_content(span):
                return np.concatenate([[NEEDLE_TOKEN], span])

    def _haystack(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` haystack tokens: a window of :func:`text_tokens` from a uniform start (wrapping
        around) for ``text_passkey``, i.i.d. filler otherwise."""
        if self.name != "text_passkey":
            return rng.integers(FILLER_TOKENS.start, FILLER_TOKENS.stop, n)
        text = text_tokens()
        return text[(int(rng.integers(len(text))) + np.arange(n)) % len(text)]

    def _other_cuts(self, cut: int, n_haystack: int, count: int, depth: float, rng: np.random.Generator):
        """Where the ``count`` needles besides the asked one go, and their rank against it in a shared
        gap (the asked needle is rank 1): ``(cuts, rank)``."""
        if self.name == "latest":  # earlier assignments, the asked one last in its gap
            return rng.integers(0, cut + 1, count).tolist(), 0
        if self.name == "first":  # later assignments, the asked one first in its gap
            return rng.integers(cut, n_haystack + 1, count).tolist(), 2
        # Ties with the asked needle put it nearer its own end: depth 0 right after START, depth 1
        # right before QUERY.
        return rng.integers(0, n_haystack + 1, count).tolist(), 2 if depth <= 0.5 else 0

    def sample(self, length: int, depth: float, rng: np.random.Generator) -> SyntheticSample:
        """A sequence of exactly ``length`` tokens with the (asked) needle at ``depth`` of the haystack.

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
        n_haystack = int(length) - self.min_length()
        haystack = self._haystack(n_haystack, rng)  # (n_haystack,)
        cut = round(depth * n_haystack)
        others, rank = self._other_cuts(cut, n_haystack, len(needles) - 1, depth, rng)
        cuts, ranks = [cut] + others, [1] + [rank] * len(others)
        order = sorted(range(len(needles)), key=lambda i: (cuts[i], ranks[i], i))
        pieces, starts, done, at = [np.array([START_TOKEN])], {}, 0, 1
        for i in order:
            pieces += [haystack[done : cuts[i]], needles[i]]
            at += cuts[i] - done
            starts[i], done, at = at, cuts[i], at + len(needles[i])
        pieces += [haystack[done:], query]
        tokens = np.concatenate(pieces).astype(np.int64)  # (length,)
        answer_mask = np.zeros(length, dtype=bool)
        query_values = (query >= VALUE_TOKENS.start) & (query < VALUE_TOKENS.stop)
        answer_mask[-len(query) :] = query_values  # the values in the query part
        loss_mask = np.arange(length) > 0 if self.name == "text_passkey" else answer_mask
        needle_starts = [starts[0] + int(offset) for offset in asked]
        needle_starts += [starts[i] for i in order if i != 0]
        return SyntheticSample(tokens, answer_mask, loss_mask, tuple(needle_starts), float(depth))

    def batch(
        self, batch_size: int, length: int, rng: np.random.Generator, depth: float | None = None
    ) -> tuple[Tensor, Tensor]:
        """``batch_size`` samples as ``(inputs, targets)``, both int64 ``(B, length - 1)``.

        ``inputs`` is ``tokens[:-1]``; ``targets`` is ``tokens[1:]`` at answer tokens and
        ``IGNORE_INDEX`` (-100) everywhere else: what exact match scores. Row ``b`` is :meth:`sample`
        with ``rng`` as the rows before left it; with ``depth=None`` each row first draws its depth,
        ``rng.random()``.
        """
        batch_size = _check_int("batch_size", batch_size, 1)
        rows = [self.sample(length, rng.random() if depth is None else depth, rng) for _ in range(batch_size)]
        return targets_of(rows, "answer_mask")


def targets_of(samples: list[SyntheticSample], mask: str) -> tuple[Tensor, Tensor]:
    """``(inputs, targets)`` of equally long ``samples``, ``(B, L - 1)`` each: ``targets`` is
    ``tokens[1:]`` where the sample's ``mask`` (``"answer_mask"`` or ``"loss_mask"``) holds and
    ``IGNORE_INDEX`` elsewhere."""
    tokens = torch.from_numpy(np.stack([s.tokens for s in samples]))  # (B, L)
    kept = torch.from_numpy(np.stack([getattr(s, mask) for s in samples]))  # (B, L)
    return tokens[:, :-1], tokens[:, 1:].masked_fill(~kept[:, 1:], IGNORE_INDEX)


def content_answers(tokens: np.ndarray, answer_mask: np.ndarray, context: int) -> bool:
    """Whether a reader of content alone answers every answer token of ``tokens: (L,)`` right: the
    control of the position tasks.

    For an answer at ``t`` (read after the right tokens before it), the reader takes the last ``c``
    tokens, ``tokens[t - c : t]``, for the largest ``c <= context`` that also occurs earlier (followed
    by a token before ``t``), and reads the token after each earlier occurrence. The answer is right
    only when every occurrence is followed by ``tokens[t]``: a reader with no order cannot prefer one
    occurrence to another. No occurrence of even the last token: wrong. ``context`` 1 is what an
    induction head matches without a token shift, 2 with it.
    """
    tokens = np.asarray(tokens)
    for t in np.flatnonzero(answer_mask):
        for c in range(min(context, t), 0, -1):
            ends = np.arange(c, t)  # an occurrence of tokens[t - c : t] ending right before ends
            same = np.ones(len(ends), dtype=bool)
            for back in range(1, c + 1):
                same &= tokens[ends - back] == tokens[t - back]
            if same.any():
                if (tokens[ends[same]] != tokens[t]).any():
                    return False
                break
        else:
            return False
    return True


def training_lengths(max_len: int, min_len: int, rng: np.random.Generator) -> int:
    """One training length drawn uniformly from ``[min_len, max_len]`` (both included)."""
    min_len = _check_int("min_len", min_len, 1)
    max_len = _check_int("max_len", max_len, 1)
    if max_len < min_len:
        raise ValueError(f"max_len must be at least min_len = {min_len}, got {max_len}")
    return int(rng.integers(min_len, max_len + 1))
