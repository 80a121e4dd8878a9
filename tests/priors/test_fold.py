"""Folded lanes reproduce the log-prior up to a per-query constant on the visible keys."""

from __future__ import annotations

import pytest
import torch
from factories import PRIOR_NAMES, make_prior

from priorattn.priors import GGD, GOAT, ALiBi

FOLDABLE = [n for n in PRIOR_NAMES if make_prior(n, 1).can_fold(True)]


def row_centred(K, visible):
    """Subtract each row's first visible value, then zero the invisible cells."""
    first = visible.float().argmax(-1, keepdim=True)
    return (K - K.gather(-1, first.expand(*K.shape[:-1], 1))).masked_fill(~visible, 0.0)


@pytest.mark.parametrize("name", FOLDABLE)
@pytest.mark.parametrize("offset", [0, 37, 5000])
def test_fold_equals_log_prior_up_to_row_constants(name, offset):
    prior = make_prior(name, 3, seed=1)
    q_pos = torch.arange(offset + 4, offset + 10)
    k_pos = torch.arange(offset, offset + 10)
    lanes = prior.fold(q_pos, k_pos)
    folded = lanes.q @ lanes.k.transpose(-1, -2)
    if lanes.key_bias is not None:
        folded = folded + lanes.key_bias[..., None, :]
    if lanes.slope is not None:
        folded = folded + lanes.slope[:, None, None] * k_pos.double()
    visible = k_pos[None, :] <= q_pos[:, None]
    K = prior.log_prior(q_pos, k_pos).expand_as(folded)
    assert torch.allclose(row_centred(folded, visible), row_centred(K, visible), atol=1e-9)


@pytest.mark.parametrize("name", FOLDABLE)
def test_fold_slope_is_the_folds_slope(name):
    """``fold_slope`` answers a route's question without folding: the same slope as the fold's."""
    prior = make_prior(name, 3, seed=1)
    slope, pos = prior.fold_slope(), torch.arange(3, 9)
    expected = prior.fold(pos, pos).slope
    assert (slope is None) == (expected is None)
    assert slope is None or torch.equal(slope, expected)


@pytest.mark.parametrize("name", FOLDABLE)
def test_slope_bound_bounds_the_fold_slope_without_reading_it(name):
    """What routes size their runs by where the slope is not free to read (on meta: no values)."""
    prior = make_prior(name, 3, seed=1)
    slope, bound = prior.fold_slope(), prior.to("meta").slope_bound()
    assert (slope is None) == (bound == 0.0)
    assert slope is None or slope.abs().max() <= bound


def test_fold_lane_counts():
    assert ALiBi(4).fold_width == 1
    assert GOAT(4, 5).fold_width == 2 * 5 + 2
    assert GOAT(4, 5, sink=False, slope=False).fold_width == 10


def test_fold_rules():
    assert ALiBi(2).can_fold(causal=True) and not ALiBi(2).can_fold(causal=False)
    assert not GGD(2).can_fold(causal=True)
    assert GOAT(2, 2, slope=False).can_fold(causal=False)
    assert not GOAT(2, 2).can_fold(causal=False)
    with pytest.raises(TypeError, match="GGD cannot be folded"):
        GGD(2).fold(torch.arange(3), torch.arange(3))


def test_goat_keys_lanes_are_shared_across_heads_without_a_sink():
    lanes = GOAT(4, 3, sink=False).fold(torch.arange(5), torch.arange(5))
    assert lanes.q.shape == (4, 5, 6) and lanes.k.shape == (1, 5, 6) and lanes.key_bias is None
    assert lanes.slope.shape == (4,)
