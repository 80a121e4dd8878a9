"""Scalar sort attention (seed 002): scalar Gaussian-kernel and hybrid attention heads.

``scalar_attention`` is the functional op (the dense definition and the folded routes); see
``docs/scalar.md``.
"""

from .functional import scalar_attention

__all__ = ["scalar_attention"]
