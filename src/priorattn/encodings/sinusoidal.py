"""Absolute sinusoidal position embeddings (Vaswani et al., 2017, Section 3.5)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..checks import describe, is_integer_tensor


class Sinusoidal(nn.Module):
    """``PE(p, 2i) = sin(p / base^(2i / d))``, ``PE(p, 2i + 1) = cos(p / base^(2i / d))``.

    Added to the token embeddings at the model's input, not inside attention. Angles are formed in
    float64; the result is cast to ``dtype`` (default: torch's default dtype).
    """

    def __init__(self, d_model: int, base: float = 10_000.0):
        super().__init__()
        if not isinstance(d_model, int) or d_model < 2 or d_model % 2:
            raise ValueError(f"d_model must be even (sin/cos pairs), got {d_model!r}")
        if not base > 1.0:
            raise ValueError(f"base must be > 1, got {base!r}")
        self.d_model = d_model
        self.base = float(base)

    def forward(self, positions: Tensor, dtype: torch.dtype | None = None) -> Tensor:
        """``(..., L, d_model)`` for integer ``positions: (..., L)``."""
        if not is_integer_tensor(positions) or positions.dim() < 1:
            raise ValueError(
                f"positions must be an integer tensor of shape (..., L), got {describe(positions)}"
            )
        two_i = torch.arange(0, self.d_model, 2, dtype=torch.float64, device=positions.device)
        angle = positions.to(torch.float64)[..., None] / self.base ** (two_i / self.d_model)
        pe = torch.stack([angle.sin(), angle.cos()], dim=-1)  # (..., L, d/2, 2)
        return pe.flatten(-2).to(torch.get_default_dtype() if dtype is None else dtype)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, base={self.base:g}"
