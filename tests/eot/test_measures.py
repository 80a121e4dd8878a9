"""The attention-row measures the seeds' theorems are stated in: hand-computed cases and bad input."""

from __future__ import annotations

import math

import pytest
import torch

from priorattn.eot import (
    content_position_log_z,
    content_range,
    context_sensitivity,
    sensitivity_bound,
    sink_margin,
)

F64 = torch.float64


def test_content_range_is_max_minus_min_over_visible_keys():
    scores = torch.tensor([[1.0, 5.0, -2.0], [0.5, 0.5, 0.5]], dtype=F64)
    visible = torch.tensor([[True, True, False], [True, True, True]])
    torch.testing.assert_close(content_range(scores, visible), torch.tensor([4.0, 0.0], dtype=F64))
    torch.testing.assert_close(content_range(scores), torch.tensor([7.0, 0.0], dtype=F64))


def test_sink_margin_per_row_and_shared_sink():
    K = torch.tensor([[3.0, 1.0, 2.5], [0.0, 4.0, 9.0]], dtype=F64)
    visible = torch.tensor([[True, True, True], [True, True, False]])
    torch.testing.assert_close(sink_margin(K, 0, visible), torch.tensor([0.5, -4.0], dtype=F64))
    torch.testing.assert_close(
        sink_margin(K, torch.tensor([0, 1]), visible), torch.tensor([0.5, 4.0], dtype=F64)
    )


def test_sink_margin_of_a_row_with_only_the_sink_is_infinite():
    K = torch.tensor([[2.0, 7.0]], dtype=F64)
    assert sink_margin(K, 0, torch.tensor([[True, False]])).item() == math.inf


def test_context_sensitivity_is_the_weight_off_the_sink():
    p = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]], dtype=F64)
    torch.testing.assert_close(context_sensitivity(p, 0), torch.tensor([0.3, 0.9], dtype=F64))
    torch.testing.assert_close(
        context_sensitivity(p, torch.tensor([0, 2])), torch.tensor([0.3, 0.2], dtype=F64)
    )


def test_sensitivity_bound_hand_cases():
    margin = torch.tensor([0.0, math.log(3.0), 1e4, -1e4, 5.0], dtype=F64)
    keys = torch.tensor([5, 4, 7, 7, 1])
    expected = torch.tensor([4 / 5, 3 / 6, 0.0, 1.0, 0.0], dtype=F64)
    torch.testing.assert_close(sensitivity_bound(margin, keys), expected)
    # a content range omega takes omega off the margin
    torch.testing.assert_close(
        sensitivity_bound(margin[1], keys[1], omega=math.log(3.0)), torch.tensor(3 / 4, dtype=F64)
    )


def test_content_position_log_z_hand_cases():
    # p_cont = [1/4, 3/4], p_pos = [3/4, 1/4]: overlap 3/8, log Z = log(8/3)
    f = torch.tensor([0.0, math.log(3.0)], dtype=F64)
    g = torch.tensor([math.log(3.0), 0.0], dtype=F64)
    torch.testing.assert_close(content_position_log_z(f, g), torch.tensor(math.log(8 / 3), dtype=F64))
    # a uniform prior: log n whatever the content; masked keys do not count
    f = torch.randn(2, 6, dtype=F64)
    visible = torch.tensor([[True] * 6, [True, True, True, False, False, False]])
    log_z = content_position_log_z(f, torch.zeros(6, dtype=F64), visible)
    torch.testing.assert_close(log_z, torch.tensor([math.log(6), math.log(3)], dtype=F64))


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: content_range(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.bool)), "every row needs"),
        (lambda: sink_margin(torch.zeros(2, 3), 3), "sink must index one of the 3 keys"),
        (
            lambda: sink_margin(torch.zeros(1, 3), 1, torch.tensor([[True, False, True]])),
            "sink key must be visible",
        ),
        (lambda: context_sensitivity(torch.zeros(2, 3), -1), "sink must index"),
        (
            lambda: content_position_log_z(torch.zeros(3), torch.zeros(3), torch.zeros(3, dtype=torch.bool)),
            "every row",
        ),
    ],
)
def test_bad_input_is_a_clear_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()
