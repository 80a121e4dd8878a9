"""Axial 2D RoPE (Heo et al., 2024, "Rotary Position Embedding for Vision Transformer")."""

from __future__ import annotations

import torch
from torch import Tensor

from ..encodings import RoPE
from .positions import unpack_positions


class RoPE2D(RoPE):
    """Rotate the first half of the lanes by the patch's row, the second half by its column.

    Each half is a 1D :class:`~priorattn.encodings.RoPE` of width ``head_dim / 2``, so
    ``<rope(q, i), rope(k, j)>`` depends on ``(dy, dx)`` only. The class token stays unrotated
    (the rotation of row 0, column 0). Positions are packed 2D positions (:mod:`.positions`).
    """

    def __init__(self, head_dim: int, base: float = 100.0):
        if not isinstance(head_dim, int) or head_dim < 4 or head_dim % 4:
            raise ValueError(
                f"2D RoPE rotates lane pairs along rows and columns: head_dim must be a multiple of 4, "
                f"got {head_dim!r}"
            )
        super().__init__(head_dim, base)
        self.axis = RoPE(head_dim // 2, base)

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        """Rotate ``x: (B, H, L, D)`` to packed 2D ``positions: (L,)`` or ``(B, L)``."""
        grid = unpack_positions(positions)
        by_row, by_col = x.chunk(2, dim=-1)
        return torch.cat([self.axis(by_row, grid.row), self.axis(by_col, grid.col)], dim=-1)
