"""Perplexity beyond the training length (seed 003 App. D.2, Fig. 6; Press et al. 2022).

At each evaluation length ``L`` the text is cut into non-overlapping windows of ``L + 1`` tokens
inside documents; each window is scored in one (chunked) pass, every target seeing all tokens before
it in the window. Reported per length:

- ``loss`` / ``ppl``: mean next-token loss over every target of every window, and its exponential;
  ``loss_se``: the standard error of ``loss`` over windows (``None`` for one window);
- ``tail_loss``: the mean over targets whose context is longer than the training length ``T``
  (target index ``t >= T``: a model trained on ``T``-token windows never predicted there); ``None``
  when ``L <= T``;
- ``position_loss``: the mean loss of targets binned by position (bins ``[2^k, 2^(k+1))``), the
  view of seed 003 Fig. 6 within one window;
- ``paired_delta``: windows at different lengths hold different text, and passage difficulty alone
  moves a window's loss by ~0.15 nats at this scale. The paired measure cancels it: for the last
  ``T // 2`` targets of each window, their mean loss with the window's whole context minus their mean
  loss in a separate window made of the window's last ``T + 1`` tokens. Negative or zero: the extra
  context helps or does no harm; positive: the mechanism breaks down past ``T``. With its standard
  error over windows (``None`` for ``L <= T``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from ..checks import check_int
from .scoring import token_losses

TOKENS_PER_CALL = 1 << 14  # windows of one length are batched up to this many tokens per forward


def candidate_windows(documents: Sequence[np.ndarray], length: int) -> list[tuple[int, int]]:
    """``(document, start)`` of every non-overlapping window of ``length + 1`` tokens."""
    return [
        (d, start)
        for d, tokens in enumerate(documents)
        for start in range(0, len(tokens) - length, length + 1)
    ]


def pick_windows(documents: Sequence[np.ndarray], length: int, windows: int, seed: int) -> list[np.ndarray]:
    """Up to ``windows`` windows of ``length + 1`` tokens, chosen by ``seed`` among all candidates."""
    candidates = candidate_windows(documents, length)
    if not candidates:
        longest = max((len(t) for t in documents), default=0)
        raise ValueError(
            f"no document of the evaluation text has {length + 1} tokens (the longest has {longest}): "
            "give longer text (--data) or shorter --lengths"
        )
    rng = np.random.default_rng([seed, length])
    chosen = sorted(rng.choice(len(candidates), min(windows, len(candidates)), replace=False).tolist())
    return [documents[d][s : s + length + 1].astype(np.int64) for d, s in (candidates[i] for i in chosen)]


def window_losses(model, windows: list[np.ndarray], chunk: int | None) -> torch.Tensor:
    """Per-target losses ``(n, L)`` of ``n`` windows of ``L + 1`` tokens, a few windows per call."""
    length = len(windows[0]) - 1
    per_call = max(1, TOKENS_PER_CALL // length)
    parts = []
    for i in range(0, len(windows), per_call):
        batch = torch.from_numpy(np.stack(windows[i : i + per_call]))  # (b, L + 1)
        parts.append(token_losses(model, batch, chunk).double())
    return torch.cat(parts)  # (n, L)


def position_bins(length: int) -> list[int]:
    """Bin edges ``1, 2, 4, ..., length + 1`` of target positions 1..length (position = index + 1):
    bins ``[2^k, 2^(k+1))``, the last one closed at ``length``."""
    return [1] + [1 << k for k in range(1, length.bit_length()) if 1 << k < length] + [length + 1]


def evaluate_ppl(
    model,
    documents: Sequence[np.ndarray],
    *,
    lengths: Sequence[int],
    train_len: int,
    windows: int = 8,
    seed: int = 0,
    chunk: int | None = None,
    progress: bool = True,
) -> dict:
    """Perplexity of ``model`` at each of ``lengths`` over ``documents`` (token arrays).

    ``train_len`` is the length the model was trained at (a positive int); ``windows`` the windows
    scored per length (a positive int; fewer where the text has fewer). Deterministic for a ``seed``
    (an int >= 0). ``chunk``: tokens per forward call (``None``: as many as 256 MiB of logits hold).
    Returns the dict written to ``results.json``: ``lengths``, ``windows``, ``loss``, ``loss_se``,
    ``ppl``, ``tail_loss``, ``paired_delta``, ``paired_delta_se``, ``position_loss`` (per length:
    ``{"edges", "loss"}``), ``train_len``.
    """
    check_lengths(lengths)
    check_int("train_len", train_len, 1)
    check_int("windows", windows, 1)
    check_int("seed", seed, 0)
    check_chunk(chunk)
    if len(documents) == 0:
        raise ValueError("documents must hold at least one token array, got none")
    half = max(1, train_len // 2)
    result = dict(train_len=train_len, lengths=list(lengths), windows=[], loss=[], loss_se=[], ppl=[])
    result["tail_loss"] = []
    result |= dict(paired_delta=[], paired_delta_se=[], position_loss=[])
    bar = tqdm(total=len(lengths), desc="ppl", unit="length", disable=not progress)
    for length in lengths:
        chosen = pick_windows(documents, length, windows, seed)
        losses = window_losses(model, chosen, chunk)  # (n, L)
        loss = float(losses.mean())
        result["windows"].append(len(chosen))
        result["loss"].append(loss)
        result["loss_se"].append(standard_error(losses.mean(1)))
        result["ppl"].append(math.exp(loss))
        result["tail_loss"].append(float(losses[:, train_len:].mean()) if length > train_len else None)
        edges = position_bins(length)
        binned = [float(losses[:, a - 1 : b - 1].mean()) for a, b in zip(edges, edges[1:])]
        result["position_loss"].append(dict(edges=edges, loss=binned))
        delta, se = None, None
        if length > train_len:
            short = window_losses(model, [w[-(train_len + 1) :] for w in chosen], chunk)  # (n, T)
            deltas = losses[:, -half:].mean(1) - short[:, -half:].mean(1)  # (n,)
            delta, se = float(deltas.mean()), standard_error(deltas)
        result["paired_delta"].append(delta)
        result["paired_delta_se"].append(se)
        bar.update(1)
        bar.set_postfix(length=length, loss=f"{loss:.3f}")
    bar.close()
    return result


def standard_error(values: torch.Tensor) -> float | None:
    """The standard error of the mean of ``values: (n,)`` (sample standard deviation over
    ``sqrt(n)``); ``None`` for one value."""
    return float(values.std() / math.sqrt(len(values))) if len(values) > 1 else None


def check_chunk(chunk: int | None) -> None:
    if chunk is not None:
        check_int("chunk", chunk, 1)


def check_lengths(lengths: Sequence[int]) -> None:
    if not lengths or any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in lengths):
        raise ValueError(f"lengths must be positive integers, got {list(lengths)!r}")


def check_factors(name: str, factors: Sequence[int], past_T: bool) -> None:
    """Evaluation lengths in units of T: increasing ints from 1 (the report reads the first as T),
    with at least one past T if ``past_T``."""
    ints = all(isinstance(f, int) and not isinstance(f, bool) for f in factors)
    if not (
        ints and len(factors) >= 1 + past_T and factors[0] == 1 and list(factors) == sorted(set(factors))
    ):
        raise ValueError(
            f"{name} must be increasing ints starting at 1 (T, as the report labels it)"
            f"{', with one past T' if past_T else ''}, got {factors!r}"
        )
