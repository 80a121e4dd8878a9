from __future__ import annotations

import pytest
import torch

from priorattn.functional.inplace import softmax_, softmax_backward_


def test_softmax_in_place_equals_softmax():
    logits = torch.randn(2, 3, 7, 9, dtype=torch.float64)
    expected = torch.softmax(logits, -1)
    probs = softmax_(logits)
    assert probs.data_ptr() == logits.data_ptr() and torch.equal(probs, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_softmax_backward_in_place_equals_autograds(dtype):
    logits = torch.randn(2, 3, 7, 9, dtype=dtype, requires_grad=True)
    probs = torch.softmax(logits, -1)
    grad = torch.randn_like(probs)
    (expected,) = torch.autograd.grad(probs, logits, grad)
    written = softmax_backward_(grad, probs.detach())
    assert written.data_ptr() == grad.data_ptr() and torch.allclose(grad, expected)


def test_softmax_backward_gives_a_one_hot_row_exactly_zero():
    """A row whose weight is all on one key: delta is that key's dP exactly, so dS is exactly 0."""
    probs = torch.tensor([[0.0, 1.0, 0.0, 0.0]])
    grad = torch.tensor([[0.3, -1.7, 2.1, 0.9]])
    assert torch.equal(softmax_backward_(grad, probs), torch.zeros(1, 4))


def test_softmax_backward_refuses_a_strided_gradient():
    buffer = torch.zeros(3, 8)
    with pytest.raises(ValueError, match="contiguous"):
        softmax_backward_(buffer[:, :5], torch.softmax(torch.randn(3, 5), -1))
