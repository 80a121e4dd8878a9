"""Synthetic retrieval sequences, built in token space so every prompt has an exact length.

A retrieval sample hides one or more *needles* (a sentence carrying a value) in *filler*, then ends
with a *cue* whose continuation is the value. Two families:

- the passkey task (Mohtashami & Jaggi 2023; seed 003 Sec. 3.1): a 5-digit key in filler, the cue
  "What is the pass key? The pass key is", each digit its own token;
- needle-in-a-haystack in the RULER style (seed 003 App. E, seed 000 Fig. 3c): ``magic number``
  needles keyed by a word, in repeated filler or real corpus text, with UUID-like values, several keys
  (one asked), several values of one key (all asked) or several keys asked at once.

A sample's ``length`` is the prompt's length in tokens: intro, filler, needles and cue together; the
answer follows it. ``depth`` places the (first) needle at that fraction of the filler: 0 right after
the intro, 1 right before the cue. Values are tokenized one character at a time in the needle and in
the answer alike, so a subword tokenizer cannot merge a digit with its neighbours (seed 003: "each
digit is considered a distinct token"). Randomness comes from a ``numpy.random.Generator``, so a
sample is a pure function of its seed.

The same generators feed evaluation (:mod:`priorattn.eval`) and the retrieval mix of training
(:class:`RetrievalMix`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .tokenizer import Tokenizer

# The classic passkey haystack (Mohtashami & Jaggi 2023), also RULER's "repeat" noise.
REPEATED_FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
# Keys of RULER-style needles: short common words, all distinct.
KEY_WORDS = (
    "apple", "river", "candle", "garden", "silver", "window", "forest", "castle", "mirror", "harbor",
    "lantern", "meadow", "pepper", "saddle", "thunder", "violet", "walnut", "anchor", "basket", "copper",
    "dragon", "falcon", "ginger", "hammer", "island", "jacket", "kettle", "ladder", "marble", "needle",
    "orange", "pillow", "quartz", "rabbit", "salmon", "tunnel", "velvet", "wizard", "yellow", "zipper",
)  # fmt: skip
Tokens = list[int]
# Every value follows this mark, in the needle and after the cue. A mark that filler text never
# holds makes the lookup one exact match (an induction head's), where "is " would also match the
# filler's "The grass is green": the tiny models then learn retrieval within minutes.
MARK = "#"
NIAH_VARIANTS = ("single_repeat", "single_corpus", "single_uuid", "multikey", "multivalue", "multiquery")
# What the training mix draws from, each with its evaluation haystack (short enough for seq_len 256).
MIX_TASKS = ("passkey", "single_repeat", "single_corpus")
MIN_FILLER = 16  # filler tokens a training sample keeps at least


@dataclass(frozen=True)
class RetrievalSample:
    """A prompt of exactly the asked length, the answer that should follow it, and where needles are.

    ``needle_starts``: the token index in ``prompt`` where each needle begins, in prompt order.
    ``answer_needle``: the index into ``needle_starts`` of the needle whose value the answer starts with.
    """

    prompt: list[int]
    answer: list[int]
    needle_starts: tuple[int, ...]
    answer_needle: int
    depth: float


class RepeatedFiller:
    """:data:`REPEATED_FILLER` repeated: the same haystack every time (``rng`` is not used)."""

    def __init__(self, tokenizer: Tokenizer, text: str = REPEATED_FILLER):
        self.unit = np.asarray(tokenizer.encode(text), dtype=np.int64)
        if len(self.unit) == 0:
            raise ValueError("the filler text encodes to no tokens")

    def take(self, n: int, rng: np.random.Generator) -> list[int]:
        reps = -(-n // len(self.unit))
        return np.tile(self.unit, reps)[:n].tolist()


class CorpusFiller:
    """Real text: ``n`` consecutive tokens of ``tokens`` (a corpus split) from a random start,
    wrapping around at the end."""

    def __init__(self, tokens: np.ndarray | Sequence[int]):
        self.tokens = np.asarray(tokens)
        if len(self.tokens) == 0:
            raise ValueError("the filler corpus has no tokens")

    def take(self, n: int, rng: np.random.Generator) -> list[int]:
        start = int(rng.integers(len(self.tokens)))
        index = (start + np.arange(n)) % len(self.tokens)
        return self.tokens[index].astype(np.int64).tolist()


class RetrievalTask:
    """One task: its needles, cue and answer, and :meth:`sample` to build a prompt of a given length.

    ``name``: ``"passkey"`` or one of :data:`NIAH_VARIANTS`. ``filler``: a :class:`RepeatedFiller`
    or :class:`CorpusFiller` (``single_repeat`` and the passkey are usually given the repeated one).
    ``digits``: the passkey's length (seed 003: 5, seed 000: 8); needles carry 7-digit numbers (as
    RULER). ``needles``: how many needles the multi-needle variants hide (4, as RULER).
    """

    def __init__(self, name: str, tokenizer: Tokenizer, filler, *, digits: int = 5, needles: int = 4):
        if name != "passkey" and name not in NIAH_VARIANTS:
            raise ValueError(f"unknown retrieval task {name!r}: use 'passkey' or one of {NIAH_VARIANTS}")
        if not isinstance(digits, int) or digits < 1:
            raise ValueError(f"digits must be a positive int, got {digits!r}")
        multi = name in ("multikey", "multivalue", "multiquery")
        if not isinstance(needles, int) or needles < (2 if multi else 1):
            raise ValueError(f"needles must be an int >= 2 for {name!r}, got {needles!r}")
        self.name = name
        self.tokenizer = tokenizer
        self.filler = filler
        self.digits = digits
        self.needles = needles if multi else 1

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def chars(self, value: str) -> list[int]:
        """``value`` one character at a time, so every digit is its own token."""
        return [t for ch in value for t in self.tokenizer.encode(ch)]

    def value(self, rng: np.random.Generator) -> str:
        if self.name == "passkey":
            return "".join(str(d) for d in rng.integers(0, 10, self.digits))
        if self.name == "single_uuid":
            hex_digits = "".join("0123456789abcdef"[i] for i in rng.integers(0, 16, 32))
            cuts = (0, 8, 12, 16, 20, 32)
            return "-".join(hex_digits[a:b] for a, b in zip(cuts, cuts[1:]))
        return str(int(rng.integers(1_000_000, 10_000_000)))

    def parts(self, rng: np.random.Generator) -> tuple[Tokens, list[Tokens], list[Tokens], Tokens]:
        """``(intro, needles, values, cue)`` with fresh values and keys; needle ``i`` carries value ``i``
        and needle 0 is the one asked for (multikey: the others are distractors)."""
        if self.name == "passkey":
            key = self.chars(self.value(rng))
            intro = self.encode("Remember the pass key.\n")
            needle = self.encode(f" The pass key is {MARK}") + key + self.encode(". ")
            return intro, [needle], [key], self.encode(f"\nWhat is the pass key? The pass key is {MARK}")
        noun = "uuid" if self.name == "single_uuid" else "number"
        distinct = 1 if self.name == "multivalue" else self.needles
        keys = [KEY_WORDS[i] for i in rng.choice(len(KEY_WORDS), distinct, replace=False)]
        keys = keys * self.needles if self.name == "multivalue" else keys
        values = [self.chars(self.value(rng)) for _ in range(self.needles)]
        needles = [
            self.encode(f" The magic {noun} for {key} is {MARK}") + value + self.encode(". ")
            for key, value in zip(keys, values)
        ]
        intro = self.encode(f"Remember the magic {noun}s.\n")
        if self.name in ("multivalue", "multiquery"):  # every value asked
            subject = join_words(keys[:distinct])
            question = (
                f"\nWhat are the magic {noun}s for {subject}? The magic {noun}s for {subject} are {MARK}"
            )
            return intro, needles, values, self.encode(question)
        question = f"\nWhat is the magic {noun} for {keys[0]}? The magic {noun} for {keys[0]} is {MARK}"
        return intro, needles, values, self.encode(question)

    def answer(self, values: list[list[int]], order: list[int]) -> list[int]:
        """The tokens that should follow the cue: the asked value, or every value joined by ", " in
        the order the question names the keys (multiquery) or the needles appear (multivalue)."""
        if self.name not in ("multivalue", "multiquery"):
            return values[0]
        asked = [values[i] for i in order] if self.name == "multivalue" else values
        return sum((v + self.encode(f", {MARK}") for v in asked[:-1]), []) + asked[-1]

    def min_length(self) -> int:
        """The shortest prompt this task can build (no filler at all)."""
        intro, needles, _, cue = self.parts(np.random.default_rng(0))
        return len(intro) + sum(map(len, needles)) + len(cue)

    def answer_length(self) -> int:
        """Tokens of every answer (values have a fixed number of characters)."""
        _, _, values, _ = self.parts(np.random.default_rng(0))
        return len(self.answer(values, list(range(len(values)))))

    def sample(self, length: int, depth: float, rng: np.random.Generator) -> RetrievalSample:
        """A prompt of exactly ``length`` tokens with the (answer's) needle at ``depth`` of the filler.

        Other needles (multi-needle variants) go at uniformly random depths. Raises ``ValueError``
        when ``length`` cannot hold the intro, needles and cue.
        """
        if not isinstance(length, int) or length < 1:
            raise ValueError(f"length must be a positive int, got {length!r}")
        if not 0.0 <= depth <= 1.0:
            raise ValueError(f"depth must be in [0, 1], got {depth!r}")
        intro, needles, values, cue = self.parts(rng)
        n_filler = length - len(intro) - sum(map(len, needles)) - len(cue)
        if n_filler < 0:
            raise ValueError(
                f"length {length} is too short for the {self.name} prompt: it needs at least "
                f"{length - n_filler} tokens"
            )
        filler = self.filler.take(n_filler, rng)
        depths = [depth] + rng.random(len(needles) - 1).tolist()
        cuts = [round(d * n_filler) for d in depths]
        order = sorted(range(len(needles)), key=lambda i: (cuts[i], i))
        prompt, starts, done = list(intro), {}, 0
        for i in order:
            prompt += filler[done : cuts[i]]
            done = cuts[i]
            starts[i] = len(prompt)
            prompt += needles[i]
        prompt += filler[done:] + cue
        needle_starts = tuple(starts[i] for i in order)
        first = order[0] if self.name == "multivalue" else 0  # the needle whose value the answer starts with
        return RetrievalSample(prompt, self.answer(values, order), needle_starts, order.index(first), depth)


def join_words(words: Sequence[str]) -> str:
    """``"a, b and c"``."""
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def default_filler(name: str, tokenizer: Tokenizer, corpus_tokens: np.ndarray | None):
    """The haystack RULER uses for each task: repeated sentences for the passkey and
    ``single_repeat``, real text (``corpus_tokens``) for the rest."""
    if name in ("passkey", "single_repeat"):
        return RepeatedFiller(tokenizer)
    if corpus_tokens is None:
        raise ValueError(f"the {name} task hides its needles in corpus text: give corpus_tokens")
    return CorpusFiller(corpus_tokens)


class RetrievalMix:
    """Training batches where a ``fraction`` of the sequences are synthetic retrieval samples.

    Wraps :class:`~priorattn.data.Batches` and keeps its contract: batch ``step`` is a pure function of
    ``(seed, step)``, so resuming stays exact and the global batch is the same on any number of
    processes. Whether global row ``r`` of batch ``step`` is replaced, and by what (a task among those
    of :data:`MIX_TASKS` that fit in ``seq_len``, a uniform depth, fresh values, the task's haystack:
    the repeated sentences or ``corpus_tokens``), is drawn from a generator seeded by
    ``(seed, step, r)``. A sample is a prompt of ``seq_len + 1 - len(answer)`` tokens followed by its
    answer, one document, with the loss on every token.
    """

    def __init__(self, batches, fraction: float, tokenizer: Tokenizer, corpus_tokens: np.ndarray, seed: int):
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"the retrieval fraction must be in [0, 1], got {fraction!r}")
        self.batches = batches
        self.fraction = fraction
        self.seed = seed
        self.seq_len = batches.packed.seq_len
        tasks = [
            RetrievalTask(name, tokenizer, default_filler(name, tokenizer, corpus_tokens))
            for name in MIX_TASKS
        ]
        room = self.seq_len + 1 - MIN_FILLER  # every sample keeps some filler
        self.tasks = [task for task in tasks if task.min_length() + task.answer_length() <= room]
        self.answer_lengths = [task.answer_length() for task in self.tasks]
        if fraction > 0 and not self.tasks:
            shortest = min(task.min_length() + task.answer_length() for task in tasks) + MIN_FILLER - 1
            raise ValueError(
                f"seq_len={self.seq_len} is too short for retrieval samples (the shortest needs "
                f"{shortest}): give seq_len= of at least {shortest}, or retrieval_mix=0"
            )

    def batch(self, step: int, rank: int = 0, world_size: int = 1) -> tuple[Tensor, Tensor, Tensor]:
        tokens, targets, doc_ids = self.batches.batch(step, rank, world_size)
        if self.fraction == 0:
            return tokens, targets, doc_ids
        tokens, targets, doc_ids = tokens.clone(), targets.clone(), doc_ids.clone()
        for i in range(len(tokens)):
            rng = np.random.default_rng([self.seed, step, rank + i * world_size])
            if rng.random() >= self.fraction:
                continue
            which = int(rng.integers(len(self.tasks)))
            length = self.seq_len + 1 - self.answer_lengths[which]
            sample = self.tasks[which].sample(length, float(rng.random()), rng)
            sequence = torch.tensor(sample.prompt + sample.answer)  # (seq_len + 1,)
            tokens[i], targets[i], doc_ids[i] = sequence[:-1], sequence[1:], 0
        return tokens, targets, doc_ids
