"""2D token positions of a ViT, packed into the library's integer positions.

Attention takes one integer position per token (``q_pos``, ``k_pos``). A ViT token is either the
class token or a patch at (row, column) of the patch grid; both fit one integer:

- the class token is ``CLS_POSITION = -1``;
- the patch at ``(row, col)`` is ``row * GRID_STRIDE + col``.

The packing does not depend on the grid's size, so one prior reads the positions of every
resolution the same way: a larger image only adds rows and columns. The 2D priors and 2D RoPE
unpack them with :func:`unpack_positions`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

#: The packed position of the class token.
CLS_POSITION = -1
#: Columns per packed row: a grid may be up to this many patches wide.
GRID_STRIDE = 1 << 16


class GridPositions(NamedTuple):
    """Unpacked positions: ``row`` and ``col`` (0 at the class token) and the ``is_cls`` mask."""

    row: Tensor
    col: Tensor
    is_cls: Tensor


def grid_positions(height: int, width: int, device: torch.device | None = None) -> Tensor:
    """Packed positions ``(1 + height * width,)``: the class token, then the patches row by row."""
    if not (isinstance(height, int) and isinstance(width, int) and height >= 1 and width >= 1):
        raise ValueError(f"the patch grid must be at least 1 x 1, got {height!r} x {width!r}")
    if width > GRID_STRIDE:
        raise ValueError(f"the patch grid is {width} patches wide; at most {GRID_STRIDE} fit")
    rows = torch.arange(height, device=device)[:, None]
    cols = torch.arange(width, device=device)[None, :]
    patches = (rows * GRID_STRIDE + cols).flatten()
    return torch.cat([patches.new_full((1,), CLS_POSITION), patches])


def unpack_positions(pos: Tensor) -> GridPositions:
    """Row, column and class-token mask of packed positions ``(..., L)``."""
    if bool((pos < CLS_POSITION).any()):
        raise ValueError(
            f"2D positions are packed as row * {GRID_STRIDE} + col >= 0 (class token: "
            f"{CLS_POSITION}), got {int(pos.min())}: build them with grid_positions"
        )
    is_cls = pos == CLS_POSITION
    patch = pos.clamp(min=0)
    return GridPositions(patch // GRID_STRIDE, patch % GRID_STRIDE, is_cls)
