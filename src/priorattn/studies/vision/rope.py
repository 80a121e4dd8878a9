"""Axial 2D RoPE (Heo et al., 2024, "Rotary Position Embedding for Vision Transformer")."""

from __future__ import annotations

import torch
from torch import Tensor

from ...encodings import RoPE
from .positions import unpack_positions


class RoPE2D(RoPE):
    """Rotate the first half of the lanes by the patch's row, the second half by its column.

    Each half is a 1D :class:`~priorattn.encodings.RoPE` of width ``head_dim / 2``, so
    ``<rope(q, i), rope(k, j)>`` depends on ``(dy, dx)`` only. The class token stays unrotated
    (the rotation of row 0, column 0). Positions are packed 2D positions (:mod:`.positions`).
    A layer applies it as any RoPE (:meth:`rotations`, then :meth:`rotate`).
    """

    def __init__(self, head_dim: int, base: float = 100.0):
        if not isinstance(head_dim, int) or head_dim < 4 or head_dim % 4:
            raise ValueError(
                f"2D RoPE rotates lane pairs along rows and columns: head_dim must be a multiple of 4, "
                f"got {head_dim!r}"
            )
        super().__init__(head_dim, base)
        self.axis = RoPE(head_dim // 2, base)

    def rotations(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """The rows' rotations on the first half of the lanes, the columns' on the second."""
        grid = unpack_positions(positions)
        (cos_row, sin_row), (cos_col, sin_col) = (self.axis.rotations(p, dtype) for p in (grid.row, grid.col))
        return torch.cat([cos_row, cos_col], dim=-1), torch.cat([sin_row, sin_col], dim=-1)

    def partners(self, x: Tensor) -> Tensor:
        """Each half's :meth:`RoPE.partners`: lanes ``(r, r + D/4)`` turn together within a half."""
        return self.axis.partners(x.unflatten(-1, (2, self.head_dim // 2))).flatten(-2)
