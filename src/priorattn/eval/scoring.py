"""Running a trained model over long inputs with bounded memory: per-token losses and answers.

Long inputs go through the model in chunks of queries that attend to everything before them through
the KV cache (chunked prefill). With a causal model this is the same computation as one pass over the
whole input (the layer tests pin cached == full), but the logits held at once are ``chunk x vocab``
instead of ``L x vocab``; attention itself never builds an ``L x L`` matrix on the library's routes.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..layers import KVCache
from ..models.gpt import token_cross_entropy

LOGITS_BUDGET = 1 << 28  # bytes of float32 logits held at once (256 MiB) before prefill is chunked


def chunk_length(batch: int, vocab_size: int) -> int:
    """Query tokens per forward call so a batch's float32 logits stay within :data:`LOGITS_BUDGET`."""
    return max(1, LOGITS_BUDGET // (4 * batch * vocab_size))


@torch.no_grad()
def prefill(model, tokens: Tensor, chunk: int | None = None) -> tuple[Tensor, list[KVCache]]:
    """Feed ``tokens: (B, L)`` through ``model`` ``chunk`` queries at a time (default: as many as
    :data:`LOGITS_BUDGET` allows); return the last position's logits ``(B, V)`` and the caches."""
    last, caches, _ = _run(model, tokens, None, chunk)
    return last, caches


@torch.no_grad()
def token_losses(model, tokens: Tensor, chunk: int | None = None) -> Tensor:
    """Next-token cross-entropy at every position of ``tokens: (B, L + 1)``: ``(B, L)`` in nats,
    entry ``t`` the loss of predicting ``tokens[:, t + 1]`` from ``tokens[:, : t + 1]``."""
    _, _, losses = _run(model, tokens[:, :-1], tokens[:, 1:], chunk)
    return losses


def _run(model, inputs: Tensor, targets: Tensor | None, chunk: int | None):
    B, L = inputs.shape
    chunk = chunk or chunk_length(B, model.config.vocab_size)
    caches, losses, logits = None, [], None
    for start in range(0, L, chunk):
        logits, _, caches = model(inputs[:, start : start + chunk], caches=caches)  # (B, c, V)
        if targets is not None:
            losses.append(token_cross_entropy(logits, targets[:, start : start + chunk]))  # (B, c)
    return logits[:, -1], caches, torch.cat(losses, dim=1) if targets is not None else None


@torch.no_grad()
def answer_predictions(
    model, prompts: Tensor, answers: Tensor, chunk: int | None = None
) -> tuple[Tensor, Tensor]:
    """The model's answers to ``prompts: (B, L)`` whose right answers are ``answers: (B, A)``.

    Returns ``(teacher_forced, greedy)``, both ``(B, A)`` token ids: ``teacher_forced[:, a]`` is the
    argmax after the prompt and the *right* first ``a`` answer tokens (every digit judged on its own,
    seed 003 Sec. 3.1); ``greedy`` is what greedy decoding through the KV cache generates. Both start
    from one prefill of the prompt (a cache is extended into a new one, never changed in place).
    """
    last, caches = prefill(model, prompts, chunk)
    A = answers.shape[1]
    teacher = [last.argmax(-1)]
    if A > 1:
        logits, _, _ = model(answers[:, :-1], caches=caches)  # (B, A - 1, V)
        teacher += list(logits.argmax(-1).unbind(1))
    greedy, state = [last.argmax(-1)], caches
    for _ in range(A - 1):
        out, _, state = model(greedy[-1][:, None], caches=state)  # (B, 1, V)
        greedy.append(out[:, -1].argmax(-1))
    return torch.stack(teacher, 1), torch.stack(greedy, 1)
