"""The pieces of the blockwise route that read and differentiate a lag table."""

from __future__ import annotations

import pytest
import torch
from factories import flushes

from priorattn.functional.memeff import add_product, diagonal_sums, toeplitz_tile


@pytest.mark.parametrize("n, m", [(1, 1), (3, 5), (5, 3), (4, 4)])
def test_diagonal_sums_add_each_diagonal(n, m):
    x = torch.randn(2, n, m, dtype=torch.float64)
    expected = [[torch.diagonal(x[h], offset=m - 1 - d).sum() for d in range(n + m - 1)] for h in range(2)]
    assert torch.allclose(diagonal_sums(x), torch.tensor(expected, dtype=torch.float64))


def test_toeplitz_tile_reads_the_lag_of_each_cell_and_its_gradient_is_diagonal_sums():
    Lq = Lk = 9
    table = torch.arange(2 * (Lq + Lk - 1), dtype=torch.float64).view(2, -1)  # index i - j + Lk - 1
    rows, cols = slice(3, 7), slice(1, 6)
    tile = toeplitz_tile(table, rows, cols, Lk)
    i = torch.arange(rows.start, rows.stop)[:, None]
    j = torch.arange(cols.start, cols.stop)[None, :]
    assert torch.equal(tile, table[:, i - j + Lk - 1])
    leaf = table.clone().requires_grad_()
    grad = torch.randn(2, 4, 5, dtype=torch.float64)
    (expected,) = torch.autograd.grad(toeplitz_tile(leaf, rows, cols, Lk), leaf, grad)
    start = rows.start - cols.stop + Lk
    assert torch.allclose(expected[:, start : start + 4 + 5 - 1], diagonal_sums(grad))


def test_causal_blocks_skip_future_keys_without_reading_positions():
    """Where the masks' values are not read (an accelerator, torch.compile), plain causal masking is
    still known from the arguments: each block of queries visits no key past its last query."""
    from priorattn.functional.masks import Masking
    from priorattn.functional.memeff import key_blocks

    Lk = 10  # six queries at positions 4..9
    masking = Masking(True, torch.arange(4, 10)[None], torch.arange(Lk)[None], starts=(4, 0))
    blocks = key_blocks(masking, None, step=4)
    assert blocks == ((slice(0, 4), slice(0, 8)), (slice(4, 6), slice(0, 10)))
    full = Masking(False, torch.arange(4, 10)[None], torch.arange(Lk)[None], starts=(4, 0))
    assert [cols for _, cols in key_blocks(full, None, step=4)] == [slice(0, Lk)] * 2


def test_general_blocks_run_with_subnormals_flushed_and_leave_the_callers_mode(monkeypatch):
    """A far-reaching prior gives distant keys subnormal weights, which made the block products
    2-3x slower; both passes of the general blocks run where subnormals flush."""
    import priorattn
    from priorattn.functional import memeff
    from priorattn.priors import GOAT

    q, k, v = (torch.randn(1, 2, 40, 8, requires_grad=True) for _ in range(3))
    seen, probs = [], memeff.Plan.probs

    def watched(self, *args):
        seen.append(flushes())
        return probs(self, *args)

    monkeypatch.setattr(memeff.Plan, "probs", watched)
    out = priorattn.attention(q, k, v, prior=GOAT(2, 2), causal=True, backend="memeff")
    out.sum().backward()
    assert seen and all(seen) and not flushes()


def test_add_product_adds_into_a_block_of_columns_in_place():
    """The blocks' dk and dv sums: ``total[:, :, cols] += a @ b`` with no copy of ``total``."""
    total = torch.randn(2, 3, 10, 4, dtype=torch.float64)
    a, b = torch.randn(2, 3, 6, 5, dtype=torch.float64), torch.randn(2, 3, 5, 4, dtype=torch.float64)
    expected = total.clone()
    expected[:, :, 2:8] += a @ b
    add_product(total[:, :, 2:8], a.transpose(-1, -2).contiguous().transpose(-1, -2), b)
    assert torch.allclose(total, expected)


def test_add_product_refuses_a_total_it_cannot_view():
    total = torch.randn(3, 2, 6, 4).transpose(0, 1)  # batch and heads not mergeable in place
    with pytest.raises(RuntimeError, match="view"):
        add_product(total, torch.randn(2, 3, 6, 5), torch.randn(2, 3, 5, 4))


def test_general_blocks_take_inputs_in_the_layers_transposed_layout():
    """q, k, v as ``(B, L, H, D).transpose(1, 2)`` views (what attention layers pass): the blocks'
    gradient sums stay in place (they are allocated contiguous), and match the reference."""
    import priorattn
    from priorattn.priors import GOAT

    prior = GOAT(2, 3, train_len=64).double()
    q, k, v = (
        torch.randn(2, 20, 2, 8, dtype=torch.float64).transpose(1, 2).requires_grad_() for _ in range(3)
    )
    grads = []
    for backend in ("memeff", "reference"):
        out = priorattn.attention(q, k, v, prior=prior, backend=backend)
        grads.append(torch.autograd.grad((out * out).sum(), (q, k, v)))
    for got, expected in zip(*grads):
        assert torch.allclose(got, expected, atol=1e-10)
