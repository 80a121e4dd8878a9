"""The backward pass of softmax attention as a policy gradient (seed 004 Sec. 5-7), checked on the
attention layers of a trained model.

Each layer's weights are ``p = softmax(s / tau)`` with ``tau = sqrt(d_q)`` (the layer's content scale
is ``1 / tau``) and ``s = tau * logits``: the content score plus ``tau`` times the log-prior, the
effective score of seed 000 Eq. 8. The model runs in float64 on the reference route with every
layer's map replaced by :class:`ScoreCapture`, which makes ``s`` a leaf and keeps ``p``'s gradient, so
one backward pass of the language-model loss ``L`` gives ``dL/ds`` and the marginal utilities
``u = -dL/dp`` (Def. 5.1, Eq. 45). Then, with masked keys left out of every row:

- ``advantage`` (Thm. 5.2, Eq. 46): ``dL/ds_j = -(p_j / tau) (u_j - E_p[u])``, on every row. (The
  seed's sign: the issue's ``(1/tau) p_j (u_j - E_p[u])`` is the gradient of ``-L``.)
- ``fisher`` (Eq. 88): the Fisher information of Def. 7.2 (Eq. 78: the layer's weights ``p`` and
  autograd's Jacobian of ``log softmax(s / tau)``) equals ``(diag(p) - p p^T) / tau^2``.
- ``hessian`` (Cor. 7.5, Eq. 100): the Hessian of the potential ``tau logsumexp(s / tau)`` (Eq. 71,
  by autograd) equals ``tau F``.
- ``score_gradient_fisher`` (Thm. 7.3, Eq. 79): ``dL/ds = -tau F u``.
- ``natural_gradient`` (Eq. 98-99): the natural-gradient direction ``F^+ (-dL/ds)`` is ``tau u`` up
  to the constant direction, the null space of ``F`` that softmax ignores: ``tau (u - mean(u))``.
  ``F^+`` is taken in closed form (:func:`natural_gradient`), whose error does not grow as weights
  shrink.

The matrix identities are checked on ``rows`` sampled queries per layer and head. Each identity
reports its residual ``max |lhs - rhs| / max |rhs|`` over every checked row of every layer with its
conditioning: the absolute residual, the scale ``max |rhs|`` it is relative to, and the smallest
weight among the keys it was checked on (a GOAT layer's prior can take far keys' weights below
1e-28), so that rounding can be told from a failure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..functional.normalizers import Shannon, regularizer
from .trained import capturing, pick_indices

IDENTITIES = {
    "advantage": "seed 004 Thm. 5.2, Eq. 46: dL/ds_j = -(p_j / tau) (u_j - E_p[u])",
    "fisher": "seed 004 Eq. 78 = Eq. 88: F = (diag(p) - p p^T) / tau^2",
    "hessian": "seed 004 Cor. 7.5, Eq. 100: Hessian of tau logsumexp(s / tau) = tau F",
    "score_gradient_fisher": "seed 004 Thm. 7.3, Eq. 79: dL/ds = -tau F u",
    "natural_gradient": "seed 004 Eq. 98-99: F^+ (-dL/ds) = tau (u - mean(u))",
}


class ScoreCapture(Shannon):
    """Softmax of the logits that records, per call, the effective scores ``s = tau * logits`` (a
    leaf, so ``s.grad`` is ``dL/ds``) and the weights ``p = softmax(s / tau)`` (``p.grad`` kept)."""

    def __init__(self, tau: float):
        super().__init__(tau)
        self.records: list[tuple[Tensor, Tensor, Tensor]] = []

    def normalize(self, scores: Tensor, visible: Tensor | None = None) -> Tensor:
        s = (self.tau * scores).detach().requires_grad_(True)
        p = super().normalize(s, visible)
        p.retain_grad()
        self.records.append((s, p, visible))
        return p


@dataclass
class LayerScores:
    """One layer's attention on a batch: ``(B, H, L, L)`` scores, weights and their gradients."""

    tau: float
    s: Tensor
    p: Tensor
    grad_s: Tensor  # dL/ds
    utility: Tensor  # u = -dL/dp
    visible: Tensor  # (B or 1, 1, L, L) bool


def capture_scores(model, tokens: Tensor) -> tuple[float, list[LayerScores]]:
    """The loss of ``model`` (float64) on ``tokens: (B, L + 1)`` and each layer's captured attention."""
    with capturing(model, lambda layer: ScoreCapture(math.sqrt(layer.content_dim))) as captures:
        _, loss, _ = model(tokens[:, :-1], targets=tokens[:, 1:])
        loss.backward()
    layers = []
    for capture in captures:
        ((s, p, visible),) = capture.records
        layers.append(LayerScores(capture.tau, s.detach(), p.detach(), s.grad, -p.grad, visible))
    return loss.item(), layers


class Residuals:
    """Running ``max |lhs - rhs|``, ``max |rhs|`` and smallest weight checked, per identity."""

    def __init__(self):
        self.error = dict.fromkeys(IDENTITIES, 0.0)
        self.size = dict.fromkeys(IDENTITIES, 0.0)
        self.smallest_weight = dict.fromkeys(IDENTITIES, 1.0)

    def add(self, name: str, lhs: Tensor, rhs: Tensor, weights: Tensor) -> None:
        """``lhs`` against ``rhs``, checked on keys of the layer's ``weights`` (0: a masked key)."""
        if rhs.numel():  # torch.maximum keeps a NaN, where Python's max would drop it
            error = torch.maximum(torch.tensor(self.error[name]), (lhs - rhs).abs().max())
            self.error[name] = error.item()
            self.size[name] = max(self.size[name], rhs.abs().max().item())
            seen = weights[weights > 0]
            if seen.numel():
                self.smallest_weight[name] = min(self.smallest_weight[name], seen.min().item())

    def report(self) -> dict[str, dict[str, float]]:
        """Per identity: ``relative`` (``max |lhs - rhs| / max |rhs|``, 0 where nothing was compared),
        ``absolute``, ``scale`` (``max |rhs|``) and ``smallest_weight``."""
        return {
            name: dict(
                relative=self.error[name] / self.size[name] if self.size[name] else 0.0,
                absolute=self.error[name],
                scale=self.size[name],
                smallest_weight=self.smallest_weight[name],
            )
            for name in IDENTITIES
        }


def add_advantage(residuals: Residuals, layer: LayerScores, heads: Sequence[int]) -> None:
    """Eq. 46 on every row of the given heads."""
    p, u = layer.p[:, heads], layer.utility[:, heads]
    expected_utility = (p * u).sum(-1, keepdim=True)  # Eq. 47
    residuals.add("advantage", layer.grad_s[:, heads], -(p / layer.tau) * (u - expected_utility), p)


def add_row_matrices(residuals: Residuals, layer: LayerScores, b: int, h: int, i: int) -> None:
    """The Fisher, Hessian and natural-gradient identities on one query row, over its visible keys."""
    tau = layer.tau
    keys = layer.visible[min(b, layer.visible.shape[0] - 1), 0, i] & (layer.p[b, h, i] > 0)
    s, p = layer.s[b, h, i, keys], layer.p[b, h, i, keys]  # the layer's own weights p
    g, u = layer.grad_s[b, h, i, keys], layer.utility[b, h, i, keys]
    score = torch.func.jacrev(lambda x: torch.log_softmax(x / tau, dim=-1))(s)  # d log p_i / d s_j
    fisher = score.T @ (p[:, None] * score)  # Eq. 78: sum_i p_i (d log p_i)(d log p_i)^T
    residuals.add("fisher", fisher, (torch.diag(p) - torch.outer(p, p)) / tau**2, p)
    hessian = torch.func.hessian(lambda x: tau * torch.logsumexp(x / tau, dim=-1))(s)
    residuals.add("hessian", hessian, tau * fisher, p)
    residuals.add("score_gradient_fisher", g, -tau * fisher @ u, p)
    residuals.add("natural_gradient", natural_gradient(p, g, tau), tau * (u - u.mean()), p)


def natural_gradient(p: Tensor, g: Tensor, tau: float) -> Tensor:
    """``F^+ (-g)`` for ``F = (diag(p) - p p^T) / tau^2`` (seed 004 Eq. 88, checked as ``fisher``)
    and a score gradient ``g`` of one row's keys: ``-tau^2 g / p``, centred.

    ``F`` is singular along the constant vector (softmax ignores a common shift of the scores), and
    for the same reason ``sum_j g_j = 0``: then ``F x = -g`` for every ``x = -tau^2 g / p + c 1``
    (``F (g / p) = g - p sum_j g_j``), and ``F^+`` picks the one orthogonal to the null space, the
    centred one. Each component divides ``g_j`` by its own ``p_j``, and autograd's ``g_j`` is
    ``p_j`` times a difference of utilities, rounded relative to ``p_j``: the error stays at
    rounding however small the weights. A numerical pseudo-inverse of ``F`` is accurate only
    normwise, and its ``1 / p`` amplifies that error in the components of tiny weights (residuals of
    1e-3 with weights of 1e-28, growing as ``eps / sqrt(p_min)`` after equilibrating ``F``)."""
    x = -(tau**2) * g / p
    return x - x.mean()


def check_layers(
    layers: list[LayerScores], heads: Sequence[int], rows: int, generator: torch.Generator
) -> dict:
    """Residuals of every identity over ``layers``, with ``rows`` random query rows per layer and head."""
    residuals = Residuals()
    for layer in layers:
        add_advantage(residuals, layer, heads)
        B, _, L, _ = layer.s.shape
        for h in heads:
            for _ in range(rows):
                b, i = (int(torch.randint(n, (), generator=generator)) for n in (B, L))
                add_row_matrices(residuals, layer, b, h, i)
    return dict(residuals=residuals.report())


def check_run(
    run_dir: str | Path,
    *,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    rows: int = 8,
    sequences: int = 2,
    length: int | None = None,
    seed: int = 0,
) -> dict:
    """The identities on the attention layers of the run in ``run_dir``, over ``sequences`` windows of
    ``length`` tokens (default: the training length) of its validation text. Returns
    ``{"residuals": {name: {"relative", "absolute", "scale", "smallest_weight"}}, "identities": ...,
    ...}`` (:meth:`Residuals.report`)."""
    from ..eval.jobs import eval_documents
    from ..eval.ppl import pick_windows
    from ..train import load_run

    run = load_run(run_dir)
    config = run.model_config
    if not regularizer(config.normalizer).is_softmax:
        raise ValueError(
            f"the identities of seed 004 Sec. 5-7 are those of softmax attention; {run_dir} uses "
            f"normalizer={config.normalizer!r}"
        )
    layers = pick_indices("layer", layers, config.n_layers, "layers")
    heads = pick_indices("head", heads, config.n_heads, "heads")
    length = config.seq_len if length is None else length
    windows = pick_windows(eval_documents(run, Path(run_dir), None), length, sequences, seed)
    tokens = torch.from_numpy(np.stack(windows))  # (sequences, length + 1)
    model = run.model.double()
    loss, captured = capture_scores(model, tokens)
    generator = torch.Generator().manual_seed(seed)
    result = check_layers([captured[i] for i in layers], heads, rows, generator)
    return dict(
        result,
        identities=IDENTITIES,
        run=str(run_dir),
        step=run.step,
        layers=layers,
        heads=heads,
        rows_per_head=rows,
        tokens=list(tokens.shape),
        loss=loss,
    )
