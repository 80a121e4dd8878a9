"""The softmax and its backward in place, on buffers that the blockwise routes reuse block after
block (a fresh 8 MB block per step left the allocator holding tens of MB more at its peak)."""

from __future__ import annotations

import torch
from torch import Tensor


def softmax_(logits: Tensor) -> Tensor:
    """Softmax over the last dimension of ``logits`` in place; returns ``logits``."""
    return torch.ops.aten._softmax.out(logits, -1, False, out=logits)


def softmax_backward_(grad: Tensor, probs: Tensor) -> Tensor:
    """``grad <- probs * (grad - rowsum(probs * grad))`` in place (the softmax's backward over the
    last dimension, ``probs`` its output), one fused pass; returns ``grad``.

    Both must be contiguous: the kernel writes its output as if it were (a strided ``grad``, a view
    of a wider buffer, came back wrong). Each cell is read before it is written, so the output may
    be its input.
    """
    if not (grad.is_contiguous() and probs.is_contiguous()):
        raise ValueError("softmax_backward_ needs contiguous grad and probs")
    return torch.ops.aten._softmax_backward_data.out(grad, probs, -1, probs.dtype, grad_input=grad)
