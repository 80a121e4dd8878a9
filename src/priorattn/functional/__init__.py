"""Attention routes: the reference definition, SDPA folding, and the memory-efficient route.

:func:`flex_mask_mod` and a prior's :meth:`~priorattn.priors.Prior.score_mod` run a prior in
FlexAttention directly."""

from .api import BACKENDS, attention, flex_mask_mod

__all__ = ["BACKENDS", "attention", "flex_mask_mod"]
