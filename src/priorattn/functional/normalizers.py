"""Attention maps as solutions of ``argmin_{p in simplex} -<p, s> + Omega(p)`` (seed 004 Eq. 19).

Each regularizer ``Omega`` is a small object with its value ``penalty(p)`` and the closed-form map
``normalize(scores, visible)`` over the last dim: masked keys get exactly zero weight and a row with no
visible key gets all zeros (as the softmax routes). ``tau > 0`` scales ``Omega`` (the temperature),
so every map reads the scores as ``s / tau``.

- :class:`Shannon`: ``tau sum_j p_j log p_j`` -> ``softmax(s / tau)`` (seed 004 Thm. 3.3, Prop. 4.1).
- :class:`KLToPrior`: ``tau KL(p || pi)`` -> ``softmax(s / tau + log pi)`` (seed 000 Prop. 3.1); any
  library prior plugs in through its ``log_prior`` (:meth:`KLToPrior.of`).
- :class:`Tsallis`: ``tau / (alpha (alpha - 1)) sum_j (p_j^alpha - p_j)`` -> alpha-entmax of
  ``s / tau`` (seed 004 Prop. 4.3), computed by the ``entmax`` package. ``alpha = 2`` is the squared
  L2 norm ``tau / 2 ||p||^2`` up to the constant ``-tau / 2`` on the simplex, so its map is
  sparsemax (Prop. 4.2).
- :class:`Locality`: Shannon plus ``gamma sum_j p_j |i - j|`` -> ``softmax((s - gamma |i - j|) / tau)``,
  ALiBi with slope ``gamma / tau`` (seed 004 Prop. 4.4).

:func:`regularizer` turns the names the attention op accepts (``"softmax"``, ``"sparsemax"``,
``"entmax15"``, or an entmax ``alpha``) into these objects.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

#: The normalizers known by name (``normalizer=`` of :func:`priorattn.attention`); an entmax ``alpha``
#: may also be given as a number.
NAMES = ("softmax", "sparsemax", "entmax15")


def _check_positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _visible(scores: Tensor, visible: Tensor | None) -> Tensor:
    return torch.ones_like(scores, dtype=torch.bool) if visible is None else visible


def masked_softmax(logits: Tensor, visible: Tensor) -> Tensor:
    """Softmax over keys where ``visible``; rows with no visible key get all-zero weights.

    Masked cells take the dtype's most negative finite value rather than -inf, so an empty row is a
    finite (discarded) softmax and its gradient stays finite. Their weights are then zeroed: where
    every visible logit of a row is -inf (a log-prior of -inf, e.g. GGD with ``beta < 0`` at lag 0)
    the finite masked cells would otherwise take the row's weight, so such a row gets zeros too.
    """
    logits = logits.masked_fill(~visible, torch.finfo(logits.dtype).min)
    return torch.softmax(logits, dim=-1) * visible


def neg_entropy(p: Tensor) -> Tensor:
    """``sum_j p_j log p_j`` over the last dim, with ``0 log 0 = 0`` (masked keys add nothing)."""
    return torch.special.xlogy(p, p).sum(-1)


class Regularizer:
    """A convex ``Omega`` over the simplex of the last dim, scaled by the temperature ``tau``."""

    #: Whether ``Omega`` carries terms tied to particular query/key positions (a prior, distances).
    depends_on_positions = False

    def __init__(self, tau: float = 1.0):
        self.tau = _check_positive("tau", tau)

    def penalty(self, p: Tensor, visible: Tensor | None = None) -> Tensor:
        """``Omega(p)`` per row, ``(...,)`` for ``p: (..., Lk)`` on the simplex (zero where masked)."""
        raise NotImplementedError

    def normalize(self, scores: Tensor, visible: Tensor | None = None) -> Tensor:
        """``argmin_p -<p, scores> + Omega(p)`` over the last dim, restricted to ``visible`` keys."""
        raise NotImplementedError

    @property
    def is_softmax(self) -> bool:
        """Whether the map is exactly ``softmax(scores)``, what the fast attention routes compute."""
        return False


class Shannon(Regularizer):
    """``Omega(p) = tau sum_j p_j log p_j = -tau H(p)``; the map is ``softmax(s / tau)`` (seed 004 Eq. 18)."""

    def penalty(self, p: Tensor, visible: Tensor | None = None) -> Tensor:
        return self.tau * neg_entropy(p)

    def normalize(self, scores: Tensor, visible: Tensor | None = None) -> Tensor:
        return masked_softmax(scores / self.tau, _visible(scores, visible))

    @property
    def is_softmax(self) -> bool:
        return type(self) is Shannon and self.tau == 1.0

    def __repr__(self) -> str:
        return f"Shannon(tau={self.tau})"


class KLToPrior(Shannon):
    """``Omega(p) = tau KL(p || pi)`` with ``pi = softmax(log_prior)`` over the visible keys.

    seed 000 Prop. 3.1: ``p = softmax(s / tau + log pi)``; the effective score is ``s + tau log pi``
    (Eq. 8), so ``log_prior`` may be unnormalized (a per-row constant drops out of the softmax).
    ``log_prior`` broadcasts against the scores, e.g. ``(H, Lq, Lk)`` from a library prior.
    """

    depends_on_positions = True

    def __init__(self, log_prior: Tensor, tau: float = 1.0):
        super().__init__(tau)
        if not isinstance(log_prior, Tensor) or not log_prior.is_floating_point():
            raise ValueError(f"log_prior must be a floating-point tensor, got {type(log_prior).__name__}")
        self.log_prior = log_prior

    @classmethod
    def of(cls, prior, q_pos: Tensor, k_pos: Tensor, tau: float = 1.0) -> KLToPrior:
        """The KL regularizer of a :class:`~priorattn.priors.Prior` at these positions."""
        return cls(prior.log_prior(q_pos, k_pos), tau)

    def penalty(self, p: Tensor, visible: Tensor | None = None) -> Tensor:
        visible = _visible(p, visible)
        log_prior = self.log_prior.to(p.dtype).masked_fill(~visible, -math.inf)
        log_pi = log_prior - torch.logsumexp(log_prior, dim=-1, keepdim=True)
        cross = torch.where(visible, p * log_pi, 0.0).sum(-1)  # sum_j p_j log pi_j
        return self.tau * (neg_entropy(p) - cross)

    def normalize(self, scores: Tensor, visible: Tensor | None = None) -> Tensor:
        return super().normalize(scores + self.tau * self.log_prior.to(scores.dtype), visible)

    def __repr__(self) -> str:
        return f"KLToPrior(log_prior {tuple(self.log_prior.shape)}, tau={self.tau})"


class Locality(Shannon):
    """``Omega(p) = tau sum_j p_j log p_j + gamma sum_j p_j d_j`` with distances ``d_j = |i - j|``.

    seed 004 Prop. 4.4: the linear penalty moves into an effective cost ``-s_j + gamma d_j`` (Eq. 40),
    so ``p = softmax((s - gamma d) / tau)``: ALiBi with slope ``m = gamma / tau``. ``gamma >= 0`` is a
    number or a per-head tensor broadcasting against the scores, e.g. ``(H, 1, 1)``.
    """

    depends_on_positions = True

    def __init__(self, gamma: float | Tensor, distance: Tensor, tau: float = 1.0):
        super().__init__(tau)
        if not isinstance(gamma, Tensor):
            gamma = torch.tensor(float(gamma), dtype=torch.float64)
        if not torch.isfinite(gamma).all() or (gamma < 0).any():
            raise ValueError(f"gamma must be finite and >= 0 (a locality penalty), got {gamma}")
        self.gamma, self.distance = gamma, distance

    @classmethod
    def of_positions(cls, gamma: float | Tensor, q_pos: Tensor, k_pos: Tensor, tau: float = 1.0) -> Locality:
        """Distances ``|q_pos[i] - k_pos[j]|`` as ``(Lq, Lk)``."""
        return cls(gamma, (q_pos[:, None] - k_pos[None, :]).abs(), tau)

    def _cost(self, like: Tensor) -> Tensor:
        return self.gamma.to(like.dtype) * self.distance.to(like.dtype)

    def penalty(self, p: Tensor, visible: Tensor | None = None) -> Tensor:
        return self.tau * neg_entropy(p) + (p * self._cost(p)).sum(-1)

    def normalize(self, scores: Tensor, visible: Tensor | None = None) -> Tensor:
        return super().normalize(scores - self._cost(scores), visible)

    def __repr__(self) -> str:
        return f"Locality(gamma={self.gamma.tolist()}, tau={self.tau})"


class Tsallis(Regularizer):
    """``Omega(p) = tau / (alpha (alpha - 1)) sum_j (p_j^alpha - p_j)``, ``alpha > 1`` (seed 004 Eq. 25).

    The map is alpha-entmax of ``s / tau``, ``p_j = ((alpha - 1) s_j / tau - threshold)_+^(1 / (alpha - 1))``
    (Eq. 33), from the ``entmax`` package: its exact sort-based kernels for ``alpha = 2`` (sparsemax)
    and ``alpha = 1.5``, bisection otherwise. ``alpha -> 1`` would be softmax.
    """

    def __init__(self, alpha: float, tau: float = 1.0):
        super().__init__(tau)
        if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 1 < alpha < math.inf:
            raise ValueError(
                "entmax alpha must be a finite number > 1 (alpha = 1 is softmax: use 'softmax'), "
                f"got {alpha!r}"
            )
        self.alpha = float(alpha)

    def penalty(self, p: Tensor, visible: Tensor | None = None) -> Tensor:
        a = self.alpha
        return self.tau / (a * (a - 1)) * (p.pow(a) - p).sum(-1)

    def normalize(self, scores: Tensor, visible: Tensor | None = None) -> Tensor:
        x = scores / self.tau
        visible = _visible(x, visible)
        # Eq. 33 with p_j <= 1 puts the threshold above (alpha - 1) max_j x_j - 1, so a key more than
        # 1 / (alpha - 1) below the row's largest visible score gets exactly zero weight. Masked keys
        # are placed below that gap rather than at -inf, which the sort-based kernels' sums would
        # turn into NaN.
        top = x.masked_fill(~visible, -math.inf).amax(-1, keepdim=True)
        top = torch.where(torch.isfinite(top), top, 0.0)  # a row with no visible key
        x = torch.where(visible, x, top - 1.0 / (self.alpha - 1.0) - 1.0)
        import entmax  # here: only the sparse maps need it, and attention alone imports without it

        if self.alpha == 2.0:
            p = entmax.sparsemax(x, dim=-1)
        elif self.alpha == 1.5:
            p = entmax.entmax15(x, dim=-1)
        else:
            p = entmax.entmax_bisect(x, self.alpha, dim=-1)
        return torch.where(visible & visible.any(-1, keepdim=True), p, 0.0)

    def __repr__(self) -> str:
        return f"Tsallis(alpha={self.alpha}, tau={self.tau})"


def regularizer(spec: str | float | Regularizer) -> Regularizer:
    """``"softmax"`` -> Shannon, ``"sparsemax"`` -> Tsallis(2), ``"entmax15"`` -> Tsallis(1.5), a number
    ``alpha > 1`` -> Tsallis(alpha), a :class:`Regularizer` -> itself."""
    if isinstance(spec, Regularizer):
        return spec
    if isinstance(spec, str):
        if spec == "softmax":
            return Shannon()
        if spec in NAMES:
            return Tsallis(2.0 if spec == "sparsemax" else 1.5)
        raise ValueError(
            f"unknown normalizer {spec!r}: use one of {NAMES}, an entmax alpha > 1 or a Regularizer"
        )
    if isinstance(spec, int | float) and not isinstance(spec, bool):
        return Tsallis(spec)
    raise ValueError(
        f"normalizer must be one of {NAMES}, an entmax alpha > 1 or a Regularizer, got {type(spec).__name__}"
    )
