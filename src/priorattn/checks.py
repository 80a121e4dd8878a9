"""Small helpers for validating arguments at the public boundary.

Checks of shapes, dtypes and options cost nothing and always run. Checks of tensor *values* (finite
prior parameters and SSMax scales) must read the values back to the host: on an accelerator every
read waits for the device, and under ``torch.compile`` it breaks the graph, on every call. They run
only when asked, with :func:`set_value_checks` (e.g. while debugging a diverging run).
"""

from __future__ import annotations

import torch
from torch import Tensor

_value_checks = False


def set_value_checks(enabled: bool) -> None:
    """Turn on (or off) the checks that read tensor values on every attention call."""
    global _value_checks
    _value_checks = bool(enabled)


def value_checks_enabled() -> bool:
    """Whether :func:`set_value_checks` turned the value checks on (off by default)."""
    return _value_checks


def check_int(name: str, value: object, low: int) -> None:
    """Raise a ``ValueError`` naming ``name`` unless ``value`` is an int (not a bool) ``>= low``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


def is_integer_tensor(t: object) -> bool:
    """A tensor of integers (not float, complex or bool): what positions and token ids must be."""
    if not isinstance(t, Tensor):
        return False
    return not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool)


def describe(t: object) -> str:
    """``int64 (2, 5)`` for a tensor, the type name otherwise: for error messages."""
    return f"{t.dtype} {tuple(t.shape)}" if isinstance(t, Tensor) else type(t).__name__


def check_positions(name: str, positions: object, B: int, L: int) -> Tensor:
    """Integer positions ``(L,)``, ``(1, L)`` or ``(B, L)`` as ``(B or 1, L)`` int64."""
    if not is_integer_tensor(positions):
        raise ValueError(f"{name} must be an integer tensor, got {describe(positions)}")
    if positions.shape not in ((L,), (1, L), (B, L)):
        shapes = f"({L},) or (1, {L})" if B == 1 else f"({L},), (1, {L}) or ({B}, {L})"
        raise ValueError(f"{name} must have shape {shapes}, got {tuple(positions.shape)}")
    return positions.long().reshape(-1, L)


def check_doc_ids(name: str, doc_ids: object, B: int, L: int) -> Tensor:
    """Document ids: an integer ``(B, L)`` tensor."""
    if not is_integer_tensor(doc_ids) or doc_ids.shape != (B, L):
        raise ValueError(f"{name} must be an integer tensor of shape ({B}, {L}), got {describe(doc_ids)}")
    return doc_ids


def check_key_padding_mask(mask: object, B: int, L: int) -> Tensor:
    """``key_padding_mask``: a bool ``(B, L)`` tensor, True at padding keys."""
    if not (isinstance(mask, Tensor) and mask.dtype == torch.bool and mask.shape == (B, L)):
        raise ValueError(
            f"key_padding_mask must be a bool tensor of shape ({B}, {L}) with True at padding keys, "
            f"got {describe(mask)}"
        )
    return mask
