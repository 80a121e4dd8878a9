"""Exact-match retrieval of one model on a synthetic task, per evaluation length and needle depth.

Every cell ``(length, depth)`` holds ``prompts`` sequences of exactly ``length`` tokens (answers
included) from :class:`~priorattn.data.synthetic.SyntheticTask`; sequence ``i`` of a cell is drawn
from a generator seeded by ``(seed, task, length, depth index, i)``, so every model is scored on the
same sequences and a cell does not depend on which others are evaluated. A sequence counts as right
when the argmax at every answer position is the answer token, each read after the right tokens
before it (teacher forcing). Greedy decoding produces the same answer exactly when this holds
(greedy's first wrong token is teacher forcing's first wrong token), so this is the greedy exact
match of seed 003 Sec. 3.1, from one forward pass per batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager, nullcontext

import numpy as np
import torch
from tqdm.auto import tqdm

from ..checks import check_int
from ..data.packing import IGNORE_INDEX
from ..data.synthetic import SYNTHETIC_TASKS, SyntheticTask, targets_of
from ..encodings import ROPE_SCALINGS, scaled_rope
from .ppl import check_lengths
from .retrieval import check_depths

TOKENS_PER_CALL = 1 << 15  # sequences of one cell go through the model up to this many tokens at once


def cell_rng(seed: int, task: str, length: int, depth_index: int, prompt: int) -> np.random.Generator:
    """The generator of prompt ``prompt`` of cell ``(length, depth_index)`` of ``task``."""
    return np.random.default_rng([seed, SYNTHETIC_TASKS.index(task), length, depth_index, prompt])


@torch.no_grad()
def exact_matches(model, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per row of ``inputs: (B, L)``: whether the argmax equals ``targets: (B, L)`` at every
    position whose target is not ``IGNORE_INDEX`` (teacher-forced). ``(B,)`` bool."""
    rows = max(1, TOKENS_PER_CALL // inputs.shape[1])
    right = []
    for start in range(0, len(inputs), rows):
        logits, _, _ = model(inputs[start : start + rows])  # (b, L, V)
        wanted = targets[start : start + rows]
        hit = (logits.argmax(-1) == wanted) | (wanted == IGNORE_INDEX)  # (b, L)
        right.append(hit.all(dim=1))
    return torch.cat(right)


@contextmanager
def extended_rope(model, scaling: str, factor: float, train_len: int):
    """RoPE extended at evaluation by ``factor`` from the training length ``train_len``, as
    ``scaling`` says (:func:`~priorattn.encodings.scaled_rope`: ``"pi"``, position interpolation,
    Chen et al. 2023, seed 000's PI baseline; ``"ntk"``; ``"yarn"``): every RoPE layer of ``model``
    rotates with it inside the block.

    Each layer's RoPE is replaced by a new one of its width and base for the block and put back after
    it: a RoPE keeps the rotations of the positions it has run in a table
    (:meth:`~priorattn.encodings.RoPE.rotations_of_run`), which an edit in place would leave in use."""
    layers = [block.attn for block in model.blocks if getattr(block.attn, "rope", None) is not None]
    saved = [layer.rope for layer in layers]
    try:
        for layer, rope in zip(layers, saved):
            layer.rope = scaled_rope(scaling, rope.head_dim, factor, original_len=train_len, base=rope.base)
        yield
    finally:
        for layer, rope in zip(layers, saved):
            layer.rope = rope


def score_synthetic(
    model,
    task: SyntheticTask,
    *,
    lengths: Sequence[int],
    depths: Sequence[float],
    prompts: int,
    seed: int,
    interpolate_from: int | None = None,
    rope_scaling: str = "pi",
    progress: bool = True,
) -> dict:
    """Exact-match counts of ``model`` on ``task``: ``correct[i][j]`` of ``prompts`` sequences of
    ``lengths[i]`` tokens with the needle at ``depths[j]``.

    ``interpolate_from=T`` scores a RoPE model trained at ``T`` extended as ``rope_scaling`` says
    (position interpolation, ``"ntk"`` or ``"yarn"``: :func:`extended_rope`) at every length
    ``n > T`` (factor ``n / T``), the trained model unchanged at ``T``. Returns ``{"task",
    "lengths", "depths", "prompts", "correct"}``; accuracies are ``correct / prompts``.
    """
    if rope_scaling not in ROPE_SCALINGS:
        raise ValueError(f"rope_scaling must be one of {', '.join(ROPE_SCALINGS)}, got {rope_scaling!r}")
    check_lengths(lengths)
    check_int("prompts", prompts, low=1)
    check_int("seed", seed, low=0)
    check_depths(depths)
    shortest = task.min_length()
    if min(lengths) < shortest:
        raise ValueError(
            f"the {task.name} task needs sequences of at least {shortest} tokens, got {min(lengths)}"
        )
    correct = np.zeros((len(lengths), len(depths)), dtype=np.int64)
    bar = tqdm(total=len(lengths) * len(depths), desc=task.name, unit="cell", disable=not progress)
    for i, length in enumerate(lengths):
        extend = interpolate_from is not None and length > interpolate_from
        factor = length / interpolate_from if extend else 1.0
        with extended_rope(model, rope_scaling, factor, interpolate_from) if extend else nullcontext():
            for j, depth in enumerate(depths):
                samples = [
                    task.sample(length, depth, cell_rng(seed, task.name, length, j, k))
                    for k in range(prompts)
                ]
                inputs, targets = targets_of(samples, "answer_mask")  # (n, length - 1) each
                correct[i, j] = int(exact_matches(model, inputs, targets).sum())
                bar.update(1)
        bar.set_postfix(length=length, acc=f"{correct[i].sum() / (prompts * len(depths)):.2f}")
    bar.close()
    return dict(
        task=task.name, lengths=list(lengths), depths=list(depths), prompts=prompts, correct=correct.tolist()
    )
