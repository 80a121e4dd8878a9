"""Attention routes: the reference definition, SDPA folding, and the memory-efficient route."""

from .api import BACKENDS, attention

__all__ = ["BACKENDS", "attention"]
