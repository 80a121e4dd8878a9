"""The maximum-entropy recency prior of seed 000 Thm. 3: hand-computed rates, symmetry, bad input.
That it is the entropy maximizer is checked in tests/theory/test_seed000_goat.py."""

from __future__ import annotations

import math

import pytest
import torch

from priorattn.eot import maxent_recency, maxent_recency_rate, mean_lag, recency_prior


def test_hand_computed_rates():
    assert abs(maxent_recency_rate(0.5, 2)) < 1e-12  # the middle lag: uniform
    assert abs(maxent_recency_rate(1.0, 3)) < 1e-12
    assert abs(maxent_recency_rate(0.25, 2) - math.log(3.0)) < 1e-12  # q = [3/4, 1/4]
    torch.testing.assert_close(maxent_recency(0.25, 2), torch.tensor([0.75, 0.25], dtype=torch.float64))


@pytest.mark.parametrize("num_lags, mean", [(5, 0.3), (64, 10.0), (1000, 1e-6), (1000, 998.9)])
def test_rate_gives_the_asked_mean_and_mirrors_around_the_middle_lag(num_lags, mean):
    rate = maxent_recency_rate(mean, num_lags)
    assert abs(mean_lag(recency_prior(rate, num_lags)).item() - mean) < 1e-9 * num_lags
    assert abs(maxent_recency_rate(num_lags - 1 - mean, num_lags) + rate) < 1e-8 * (1 + abs(rate))


@pytest.mark.parametrize(
    "mean, num_lags, message",
    [
        (0.5, 1, "num_lags must be an int >= 2"),
        (0.5, 2.0, "num_lags must be an int >= 2"),
        (0.0, 5, "mean must lie strictly between 0 and num_lags - 1 = 4"),
        (4.0, 5, "strictly between"),
        (True, 5, "strictly between"),
        (math.nan, 5, "strictly between"),
    ],
)
def test_bad_input_is_a_clear_error(mean, num_lags, message):
    with pytest.raises(ValueError, match=message):
        maxent_recency_rate(mean, num_lags)
