"""RoPE past its training length by a factor ``s``: NTK-aware base scaling and YaRN, beside position
interpolation (``RoPE(interpolation=s)``).

Peng, Quesnelle, Fan and Shippole, 2023, "YaRN: Efficient Context Window Extension of Large Language
Models" write each extension as RoPE with new frequencies ``h(theta_d)`` (and PI's positions
``m / s``): "NTK-aware" interpolation raises the base, ``b' = b s^(D / (D - 2))``, so the highest
frequency is kept and the lowest is divided by ``s``; "NTK-by-parts" keeps every frequency that turns
more than ``beta`` times over the training length ``L``, divides by ``s`` every one that turns less than
``alpha`` times, and ramps linearly in between; YaRN is NTK-by-parts with an attention temperature
``t``, ``sqrt(1/t) = 0.1 ln(s) + 1``, applied by scaling q and k alike by ``sqrt(1/t)``. At ``s = 1``
each is plain RoPE, exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from ..checks import check_int
from .rope import RoPE, rope_freqs


def check_scale(scale: object) -> float:
    """``scale`` as a float: a finite number >= 1 (a context extension), else a one-line ValueError."""
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not 1.0 <= scale < math.inf:
        raise ValueError(f"scale must be a finite number >= 1 (the context-extension factor), got {scale!r}")
    return float(scale)


class NTKAwareRoPE(RoPE):
    """RoPE with the "NTK-aware" base ``b' = b s^(D / (D - 2))`` (Peng et al. 2023; bloc97, 2023).

    ``theta_r = b'^(-2r / D)``: the highest frequency (``r = 0``) is RoPE's, the lowest
    (``r = D/2 - 1``) is RoPE's divided by ``s``, and those between are divided by less than ``s`` the
    higher they are, so the fast lanes that resolve neighbouring tokens stay as trained while the slow
    ones stretch over ``s`` times the context. Positions are not divided. ``D >= 4``: with one
    frequency there is no lowest frequency to stretch apart from the highest.
    """

    def __init__(self, head_dim: int, scale: float, base: float = 10_000.0):
        super().__init__(head_dim, base)
        if head_dim < 4:
            raise ValueError(
                f"NTK-aware scaling raises the base by s^(D / (D - 2)): head_dim must be >= 4, got {head_dim}"
            )
        self._scale = check_scale(scale)

    @property
    def scale(self) -> float:
        return self._scale

    def freqs(self, device: torch.device | None = None) -> Tensor:
        D = self.head_dim
        return rope_freqs(D, self.base * self.scale ** (D / (D - 2)), device)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, base={self.base:g}, scale={self.scale:g}"


class YaRNRoPE(RoPE):
    """YaRN (Peng et al. 2023): "NTK-by-parts" frequencies and the attention temperature.

    With RoPE's ``theta_d = base^(-2d / D)``, its wavelength ``lambda_d = 2 pi / theta_d`` and
    ``r(d) = L / lambda_d`` the turns lane pair ``d`` makes over the training length ``L``
    (``original_len``):

        gamma(r) = 0 if r < alpha, 1 if r > beta, (r - alpha) / (beta - alpha) otherwise
        h(theta_d) = (1 - gamma(r(d))) theta_d / s + gamma(r(d)) theta_d

    so pairs that turn more than ``beta`` times over ``L`` keep their frequency (trained on every
    angle, they tell neighbouring tokens apart), those that turn less than ``alpha`` times (a
    wavelength longer than ``L``) are interpolated as PI would, and a linear ramp in ``r`` joins
    them. ``alpha = 1``, ``beta = 32`` are the paper's values for LLaMA (Hugging Face's
    ``beta_slow`` and ``beta_fast``). A rotation multiplies q and k by :attr:`attention_factor`
    ``sqrt(1/t) = 0.1 ln(s) + 1``, so the content logits are divided by the temperature ``t``; a
    prior's terms, added beside the rotated lanes, are not. Positions are not divided.
    """

    def __init__(
        self,
        head_dim: int,
        scale: float,
        original_len: int,
        *,
        base: float = 10_000.0,
        alpha: float = 1.0,
        beta: float = 32.0,
    ):
        super().__init__(head_dim, base)
        self._scale = check_scale(scale)
        check_int("original_len", original_len, low=1)
        for name, value in (("alpha", alpha), ("beta", beta)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if not 0 <= alpha < beta:
            raise ValueError(f"YaRN's ramp needs 0 <= alpha < beta, got alpha={alpha!r}, beta={beta!r}")
        self.original_len = original_len
        self.alpha, self.beta = float(alpha), float(beta)

    @property
    def scale(self) -> float:
        return self._scale

    @property
    def attention_factor(self) -> float:
        """``sqrt(1/t) = 0.1 ln(s) + 1``."""
        return 0.1 * math.log(self.scale) + 1.0

    def freqs(self, device: torch.device | None = None) -> Tensor:
        theta = rope_freqs(self.head_dim, self.base, device)
        turns = self.original_len * theta / (2 * math.pi)  # r(d) = L / lambda_d
        gamma = ((turns - self.alpha) / (self.beta - self.alpha)).clamp(0.0, 1.0)
        # (1 - gamma) theta / s + gamma theta, written so that s = 1 gives theta bit for bit
        return theta * (1.0 - (1.0 - gamma) * (1.0 - 1.0 / self.scale))

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, base={self.base:g}, scale={self.scale:g}, "
            f"original_len={self.original_len}, alpha={self.alpha:g}, beta={self.beta:g}"
        )


#: RoPE's context extensions by name, each ``(head_dim, s, original_len, base) -> RoPE``.
ROPE_SCALINGS: dict[str, Callable[[int, float, int, float], RoPE]] = {
    "pi": lambda head_dim, s, original_len, base: RoPE(head_dim, base, interpolation=s),
    "ntk": lambda head_dim, s, original_len, base: NTKAwareRoPE(head_dim, s, base),
    "yarn": lambda head_dim, s, original_len, base: YaRNRoPE(head_dim, s, original_len, base=base),
}


def scaled_rope(
    scaling: str, head_dim: int, factor: float, *, original_len: int, base: float = 10_000.0
) -> RoPE:
    """A RoPE of ``head_dim`` lanes extended by ``factor`` from the training length ``original_len``:
    ``"pi"`` is :class:`RoPE` with ``interpolation=factor`` (any ``factor > 0``), ``"ntk"``
    :class:`NTKAwareRoPE`, ``"yarn"`` :class:`YaRNRoPE` with the paper's ``alpha``, ``beta`` (both with
    ``factor >= 1``). ``factor = 1`` is plain RoPE whatever the scaling."""
    if scaling not in ROPE_SCALINGS:
        raise ValueError(f"RoPE scaling must be one of {', '.join(ROPE_SCALINGS)}, got {scaling!r}")
    return ROPE_SCALINGS[scaling](head_dim, factor, original_len, base)
