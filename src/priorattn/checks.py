"""Small helpers for validating arguments at the public boundary."""

from __future__ import annotations

import torch
from torch import Tensor


def is_integer_tensor(t: object) -> bool:
    """A tensor of integers (not float, complex or bool): what positions and token ids must be."""
    if not isinstance(t, Tensor):
        return False
    return not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool)


def describe(t: object) -> str:
    """``int64 (2, 5)`` for a tensor, the type name otherwise: for error messages."""
    return f"{t.dtype} {tuple(t.shape)}" if isinstance(t, Tensor) else type(t).__name__
