"""ALiBi: its slopes and bias against Press et al.'s, written out here; its slope bound."""

from __future__ import annotations

import pytest
import torch
from factories import grid

from priorattn.priors import ALiBi, alibi_slopes

#: The shared tests' ALiBi (tests/factories.py): the standard slopes, a buffer.
RANDOM_PRIORS = {"alibi": lambda heads, rand: ALiBi(heads)}


def log_prior_by_hand(prior, h, i, j):
    """Press et al. (2022): ``-m_h |i - j|`` with the standard slopes of ``H`` heads."""
    return -alibi_slopes(prior.num_heads)[h].item() * abs(i - j)


def test_alibi_slopes_match_press_et_al():
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0**-i for i in range(1, 9)], dtype=torch.float64))
    # Non power of two: first the 4-head sequence, then every other slope of the 8-head one.
    expected = [0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125]
    assert alibi_slopes(6).tolist() == expected


def test_alibi_log_prior_is_minus_slope_times_distance():
    prior = ALiBi(4).double()
    q_pos, k_pos = grid(5, 9, offset=4)
    K = prior.log_prior(q_pos, k_pos)
    for h, m in enumerate(alibi_slopes(4).tolist()):
        for i, qi in enumerate(q_pos.tolist()):
            for j, kj in enumerate(k_pos.tolist()):
                assert K[h, i, j].item() == pytest.approx(-m * abs(qi - kj))


def test_alibi_slope_bound_follows_construction_and_loading():
    prior = ALiBi(2)
    assert prior.slope_bound() == 2.0**-4
    prior.load_state_dict({"slopes": torch.tensor([1.5, -2.0])})
    assert prior.slope_bound() == 2.0


def test_alibi_keeps_the_precision_of_floating_slopes():
    assert ALiBi(2, slopes=torch.tensor([0.1, 1 / 3], dtype=torch.float64)).slopes.dtype == torch.float64
    assert ALiBi(2, slopes=[1, 2]).slopes.dtype == torch.get_default_dtype()
