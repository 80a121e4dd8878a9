"""Uniform: standard attention (NoPE), ``K = 0``."""

from __future__ import annotations

import torch
from factories import grid

from priorattn.priors import Uniform

#: The shared tests' Uniform (tests/factories.py): it has no parameters.
RANDOM_PRIORS = {"uniform": lambda heads, rand: Uniform()}


def log_prior_by_hand(prior, h, i, j):
    """Seed 000 Eq. 3: standard attention's implicit prior is uniform, ``K = 0``."""
    return 0.0


def test_uniform_is_zero():
    assert torch.equal(Uniform().log_prior(*grid(3, 4)), torch.zeros(1, 3, 4))
