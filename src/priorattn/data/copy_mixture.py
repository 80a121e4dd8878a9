"""The copy-mixture task of seed 000 Fig. 1: each token copies the first token, copies the previous
token, or is uniform noise.

Token ``x_0`` is uniform over the vocabulary; every later token ``x_t`` draws its *source* from the
mixture weights: ``FIRST`` (``x_t = x_0``, a global pattern), ``PREVIOUS`` (``x_t = x_{t-1}``, a
local one) or ``NOISE`` (``x_t`` uniform). A language model predicting ``x_{t+1}`` should read
``x_0`` and ``x_t`` and nothing else: seed 000 Sec. 6 ("Ablating the prior") trains one with GOAT
and expects the sink ``u(j)`` to single out ``j = 0`` and the relative part the previous token.

Randomness comes from a ``torch.Generator``; :class:`CopyMixtureBatches` seeds one per step from a
hash of ``(seed, step)``, so batch ``step`` needs no state, like :class:`priorattn.data.Batches`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..checks import check_int

#: The three sources of a token, in the order of the mixture weights.
SOURCES = ("first", "previous", "noise")
FIRST, PREVIOUS, NOISE = range(len(SOURCES))


@dataclass(frozen=True)
class CopyMixture:
    """The task: ``vocab_size`` tokens and the mixture ``weights`` of (first, previous, noise).

    The weights must be non-negative and sum to 1.
    """

    vocab_size: int = 16
    weights: tuple[float, float, float] = (0.3, 0.4, 0.3)

    def __post_init__(self):
        check_int("vocab_size", self.vocab_size, low=2)
        weights = (
            tuple(self.weights)
            if isinstance(self.weights, Sequence) and not isinstance(self.weights, str)
            else None
        )
        if weights is None or len(weights) != len(SOURCES):
            raise ValueError(f"weights must be 3 numbers for {SOURCES}, got {self.weights!r}")
        if not all(isinstance(w, int | float) and math.isfinite(w) and w >= 0 for w in weights):
            raise ValueError(f"weights must be finite and >= 0, got {self.weights!r}")
        if not math.isclose(sum(weights), 1.0, abs_tol=1e-9):
            raise ValueError(f"weights must sum to 1, got {self.weights!r} (sum {sum(weights):g})")
        object.__setattr__(self, "weights", tuple(float(w) for w in weights))

    def sample(self, batch_size: int, length: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """``(tokens, sources)``, each long ``(batch_size, length)``: the tokens and where each came
        from (``FIRST``, ``PREVIOUS`` or ``NOISE``; ``x_0`` counts as noise, being uniform)."""
        check_int("batch_size", batch_size, low=1)
        check_int("length", length, low=1)
        shape = (batch_size, length)
        sources = torch.multinomial(
            torch.tensor(self.weights), batch_size * length, True, generator=generator
        )
        sources = sources.view(shape)
        sources[:, 0] = NOISE
        noise = torch.randint(self.vocab_size, shape, generator=generator)
        # A run of PREVIOUS tokens repeats the token before the run: each token's value is that of
        # its latest non-PREVIOUS position, which holds x_0 (FIRST) or its own noise draw.
        anchor_value = torch.where(sources == FIRST, noise[:, :1], noise)
        positions = torch.arange(length).expand(shape)
        anchor = torch.where(sources == PREVIOUS, 0, positions).cummax(dim=1).values
        return anchor_value.gather(1, anchor), sources

    def optimal_nll(self, tokens: Tensor, targets: Tensor) -> Tensor:
        """The best possible loss of each target ``(B, L)`` in nats: ``-log p(x_{t+1} | x_0, x_t)``
        with ``p(v) = w_first [v = x_0] + w_previous [v = x_t] + w_noise / V`` (the sources are
        independent of the past, so nothing else in it helps), ``tokens`` and ``targets`` the
        sequences and the same shifted by one."""
        first, previous, noise = self.weights
        probs = noise / self.vocab_size + first * (targets == tokens[:, :1]) + previous * (targets == tokens)
        return -probs.log()


class CopyMixtureBatches:
    """Batch ``step`` of language-model training on ``task``: ``(tokens, targets, doc_ids)``, each
    long ``(batch_size, length)``, the targets the tokens shifted by one and ``doc_ids`` zero (one
    sequence per row), as :meth:`priorattn.data.Batches.batch` gives them to ``train_step``."""

    def __init__(self, task: CopyMixture, batch_size: int, length: int, seed: int):
        check_int("batch_size", batch_size, low=1)
        check_int("length", length, low=1)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        self.task, self.batch_size, self.length, self.seed = task, batch_size, length, seed

    def generator(self, step: int) -> torch.Generator:
        """The generator of batch ``step``, seeded by a hash of ``(seed, step)``."""
        check_int("step", step, low=0)
        digest = hashlib.sha256(f"copy-mixture:{self.seed}:{step}".encode()).digest()
        return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)

    def batch(self, step: int) -> tuple[Tensor, Tensor, Tensor]:
        sequences, _ = self.task.sample(self.batch_size, self.length + 1, self.generator(step))
        tokens, targets = sequences[:, :-1], sequences[:, 1:]
        return tokens, targets, torch.zeros_like(tokens)
