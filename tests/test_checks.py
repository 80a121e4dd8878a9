"""Argument checks shared by ``priorattn.attention`` and ``PriorMultiheadAttention``: one per argument."""

from __future__ import annotations

import pytest
import torch

import priorattn
from priorattn import PriorMultiheadAttention
from priorattn.checks import check_doc_ids, check_int, check_key_padding_mask, check_positions


@pytest.mark.parametrize("value", [1, 2.0, True, "3", None])
def test_check_int_names_the_argument_and_the_bound(value):
    with pytest.raises(ValueError, match=f"steps must be an int >= 2, got {value!r}"):
        check_int("steps", value, low=2)
    check_int("steps", 2, low=2)


def test_positions_come_back_as_batch_or_one_by_length_int64():
    assert check_positions("q_pos", torch.arange(3, dtype=torch.int32), 2, 3).shape == (1, 3)
    positions = check_positions("q_pos", torch.arange(6).view(2, 3), 2, 3)
    assert positions.dtype == torch.int64 and positions.tolist() == [[0, 1, 2], [3, 4, 5]]


@pytest.mark.parametrize(
    "check, message",
    [
        (
            lambda: check_positions("k_pos", torch.arange(4), 2, 5),
            r"k_pos must have shape \(5,\), \(1, 5\) or \(2, 5\), got \(4,\)",
        ),
        (lambda: check_positions("k_pos", [0, 1], 1, 2), "k_pos must be an integer tensor, got list"),
        (lambda: check_positions("q_pos", torch.ones(2, dtype=torch.bool), 1, 2), "got torch.bool"),
        (
            lambda: check_doc_ids("doc_ids", torch.zeros(2, 3), 2, 3),
            r"doc_ids must be an integer tensor of shape \(2, 3\), got torch.float32",
        ),
        (
            lambda: check_key_padding_mask(None, 1, 3),
            r"key_padding_mask must be a bool tensor of shape \(1, 3\) .* got NoneType",
        ),
    ],
)
def test_bad_argument_names_it_what_was_expected_and_what_came(check, message):
    with pytest.raises(ValueError, match=message):
        check()


@pytest.mark.parametrize(
    "argument, value",
    [
        ("positions", torch.arange(5.0)),
        ("doc_ids", torch.zeros(2, 4, dtype=torch.long)),
        ("key_padding_mask", torch.zeros(2, 5)),
    ],
)
def test_layer_and_attention_refuse_an_argument_with_one_message(argument, value):
    x = torch.randn(2, 5, 32)
    q = torch.randn(2, 4, 5, 8)
    name = "q_pos" if argument == "positions" else argument
    with pytest.raises(ValueError) as from_layer:
        PriorMultiheadAttention(32, 4)(x, **{argument: value})
    with pytest.raises(ValueError) as from_attention:
        priorattn.attention(q, q, q, **{name: value})
    assert str(from_layer.value) == str(from_attention.value).replace(name, argument)
