"""Stand-in language models whose losses and answers are known exactly, for evaluation tests.

Each has what the evaluations use of a GPT: ``config.vocab_size`` and
``model(tokens, caches=...) -> (logits, None, caches)``, with the caches carrying what was fed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Config:
    vocab_size: int


class CyclicModel:
    """For text where token ``t`` is always followed by ``(t + 1) % V``: gives the right next token
    probability ``p_inside`` at positions ``< train_len`` and ``p_beyond`` from there on, so the loss
    of a target at index ``i`` is exactly ``-log p`` of its side."""

    def __init__(self, vocab_size: int, train_len: int, p_inside: float, p_beyond: float):
        self.config = Config(vocab_size)
        self.train_len, self.p = train_len, (p_inside, p_beyond)
        self.calls = []

    def __call__(self, tokens: Tensor, caches=None):
        B, L = tokens.shape
        past = 0 if caches is None else caches[0]
        self.calls.append(L)
        positions = past + torch.arange(L)  # (L,)
        p = torch.where(positions < self.train_len, self.p[0], self.p[1]).double()  # (L,)
        V = self.config.vocab_size
        logits = ((1 - p) / (V - 1)).log()[None, :, None].expand(B, L, V).clone()
        logits.scatter_(2, ((tokens + 1) % V)[..., None], p.log()[None, :, None].expand(B, L, 1))
        return logits, None, [past + L]


class InductionOracle:
    """Answers by copying: at each position, the token that followed the most recent earlier
    occurrence of the longest suffix ending there (an ideal induction head). It reproduces the
    value of a needle whose key the cue repeats; ``wrong=True`` always answers the next token id
    instead, so it never retrieves anything."""

    def __init__(self, vocab_size: int, wrong: bool = False, window: int = 48):
        self.config = Config(vocab_size)
        self.wrong, self.window = wrong, window

    def __call__(self, tokens: Tensor, caches=None):
        past = tokens[:, :0] if caches is None else caches[0]
        sequence = torch.cat([past, tokens], dim=1)  # (B, past + L)
        B, L = tokens.shape
        logits = torch.zeros(B, L, self.config.vocab_size)
        for b in range(B):
            row = sequence[b].tolist()
            for i in range(max(0, L - self.window), L):
                guess = copy_guess(row, past.shape[1] + i)
                if self.wrong:
                    guess = (guess + 1) % self.config.vocab_size
                logits[b, i, guess] = 10.0
        return logits, None, [sequence]


def copy_guess(row: list[int], end: int) -> int:
    """The token after the latest earlier match of the longest suffix of ``row[: end + 1]``."""
    best, guess = 0, row[end]
    for j in range(end - 1, -1, -1):
        n = 0
        while n <= j and row[j - n] == row[end - n]:
            n += 1
        if n > best:
            best, guess = n, row[j + 1]
    return guess


def nats(p: float) -> float:
    return -math.log(p)
