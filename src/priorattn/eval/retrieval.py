"""Retrieval beyond the training length: passkey (seed 003 Sec. 3.1, Fig. 3) and RULER-style
needle-in-a-haystack (seed 003 App. E, seed 000 Fig. 3c).

For every evaluation length and needle depth, ``trials`` prompts with fresh values are built
(:mod:`priorattn.data.retrieval`) and answered by the model. An answer counts when every token of it
is right. Two readings of "right", both from one prefill of the prompt:

- teacher-forced: each answer token is the argmax after the prompt and the right tokens before it
  (seed 003: "measure how accurate the model can predict the next five tokens");
- greedy: the tokens greedy decoding through the KV cache generates.

A whole answer is right under one reading exactly when it is under the other (ties of the argmax
aside), so ``accuracy`` and ``greedy_accuracy`` agree; ``token_accuracy`` (the teacher-forced share
of right tokens, seed 000's "span-token accuracy") credits near misses.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from ..checks import check_int
from ..data.retrieval import RetrievalTask
from .ppl import check_chunk, check_lengths
from .scoring import answer_predictions

RETRIEVES = 0.5  # passkey accuracy at which a model "retrieves" (at T: the gate to longer retrieval)


def uniform_depths(n: int) -> list[float]:
    """``n`` depths uniformly spaced over ``[0, 1]`` (seed 003: ``0L/19, 1L/19, ..., L`` for 20)."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"the number of depths must be a positive int, got {n!r}")
    return [i / (n - 1) for i in range(n)] if n > 1 else [0.5]


def check_depths(depths: Sequence[float]) -> None:
    """Needle depths: a non-empty list of numbers in ``[0, 1]``."""
    if not depths or any(not (isinstance(d, numbers.Real) and 0.0 <= d <= 1.0) for d in depths):
        raise ValueError(f"depths must be numbers in [0, 1], got {list(depths)!r}")


def score_answers(predicted: torch.Tensor, answers: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(exact, tokens)`` per row of ``predicted, answers: (B, A)``: 1.0 where the whole answer is
    right, and the share of right tokens."""
    right = (predicted == answers).double()  # (B, A)
    return right.min(dim=1).values, right.mean(dim=1)


def evaluate_retrieval(
    model,
    task: RetrievalTask,
    *,
    lengths: Sequence[int],
    depths: Sequence[float],
    trials: int = 3,
    seed: int = 0,
    chunk: int | None = None,
    progress: bool = True,
) -> dict:
    """Accuracy of ``model`` on ``task`` per length (rows) and depth (columns).

    Cell ``(length, depth)`` holds ``trials`` prompts, prompt ``i`` drawn from a generator seeded by
    ``(seed, length, depth index, i)``, so results are deterministic and a cell does not depend on
    which other cells are evaluated. Returns the dict written to ``results.json``: ``task``,
    ``lengths``, ``depths``, ``trials``, ``accuracy``, ``greedy_accuracy``, ``token_accuracy`` (each
    ``[[per depth] per length]`` in ``[0, 1]``), ``by_length`` and ``by_depth`` (means of
    ``accuracy``).
    """
    check_lengths(lengths)
    check_int("trials", trials, 1)
    check_int("seed", seed, 0)
    check_chunk(chunk)
    check_depths(depths)
    shortest = task.min_length()
    if min(lengths) < shortest:
        raise ValueError(
            f"the {task.name} prompt needs at least {shortest} tokens, got length {min(lengths)}"
        )
    grids = {name: np.zeros((len(lengths), len(depths))) for name in ("accuracy", "greedy", "tokens")}
    bar = tqdm(total=len(lengths) * len(depths), desc=task.name, unit="cell", disable=not progress)
    for i, length in enumerate(lengths):
        for j, depth in enumerate(depths):
            samples = [
                task.sample(length, depth, np.random.default_rng([seed, length, j, trial]))
                for trial in range(trials)
            ]
            prompts = torch.tensor([s.prompt for s in samples])  # (trials, length)
            answers = torch.tensor([s.answer for s in samples])  # (trials, A)
            teacher, greedy = answer_predictions(model, prompts, answers, chunk)
            exact, tokens = score_answers(teacher, answers)
            grids["accuracy"][i, j] = float(exact.mean())
            grids["tokens"][i, j] = float(tokens.mean())
            grids["greedy"][i, j] = float(score_answers(greedy, answers)[0].mean())
            bar.update(1)
        bar.set_postfix(length=length, acc=f"{grids['accuracy'][i].mean():.2f}")
    bar.close()
    accuracy = grids["accuracy"]
    return dict(
        task=task.name,
        lengths=list(lengths),
        depths=list(depths),
        trials=trials,
        accuracy=accuracy.tolist(),
        greedy_accuracy=grids["greedy"].tolist(),
        token_accuracy=grids["tokens"].tolist(),
        by_length=accuracy.mean(1).tolist(),
        by_depth=accuracy.mean(0).tolist(),
    )
