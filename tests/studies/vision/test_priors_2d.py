"""The 2D priors: the dense log-prior equals the 2D formula, the fold equals it, and every attention
route equals the reference, forward and backward."""

from __future__ import annotations

import math

import pytest
import torch

import priorattn
from priorattn.studies.vision import CLS_POSITION, GOAT2D, ALiBi2D, grid_positions, unpack_positions
from priorattn.studies.vision.positions import GRID_STRIDE


def random_goat2d(heads=3, freqs=2, sink=True, seed=0) -> GOAT2D:
    """A GOAT2D whose every parameter is random, so every term of the formula matters."""
    gen = torch.Generator().manual_seed(seed)
    prior = GOAT2D(heads, freqs, sink=sink, grid_size=4, sink_freqs=2, sink_hidden=4).double()
    with torch.no_grad():
        for p in prior.parameters():
            p.copy_((torch.rand(p.shape, generator=gen, dtype=torch.float64) * 2 - 1) * 0.7)
    return prior


def goat2d_by_hand(prior: GOAT2D, q_pos: list[int], k_pos: list[int]) -> torch.Tensor:
    """Seed 000 Eq. 12 over row and column displacement plus the key terms, one cell at a time."""
    H = prior.num_heads
    w = prior.rows.freqs.tolist()
    out = torch.zeros(H, len(q_pos), len(k_pos), dtype=torch.float64)
    for a, qp in enumerate(q_pos):
        for b, kp in enumerate(k_pos):
            for h in range(H):
                if kp == CLS_POSITION:
                    out[h, a, b] = prior.cls_bias[h]
                    continue
                yk, xk = divmod(kp, GRID_STRIDE)
                if prior.row_sink is not None:
                    u = prior.row_sink(torch.tensor([yk]))[h, 0] + prior.col_sink(torch.tensor([xk]))[h, 0]
                    out[h, a, b] = u
                if qp == CLS_POSITION:
                    continue
                yq, xq = divmod(qp, GRID_STRIDE)
                dy, dx = yq - yk, xq - xk
                for r, wr in enumerate(w):
                    out[h, a, b] += prior.rows.alpha[h, r] * math.cos(wr * dy)
                    out[h, a, b] += prior.rows.beta[h, r] * math.sin(wr * dy)
                    out[h, a, b] += prior.cols.alpha[h, r] * math.cos(wr * dx)
                    out[h, a, b] += prior.cols.beta[h, r] * math.sin(wr * dx)
    return out


def test_grid_positions_pack_cls_then_rows():
    pos = grid_positions(2, 3)
    assert pos.tolist() == [CLS_POSITION, 0, 1, 2, GRID_STRIDE, GRID_STRIDE + 1, GRID_STRIDE + 2]
    grid = unpack_positions(pos)
    assert grid.row.tolist() == [0, 0, 0, 0, 1, 1, 1]
    assert grid.col.tolist() == [0, 0, 1, 2, 0, 1, 2]
    assert grid.is_cls.tolist() == [True] + [False] * 6


def test_unpack_refuses_positions_that_are_not_packed():
    with pytest.raises(ValueError, match="build them with grid_positions"):
        unpack_positions(torch.tensor([-5, 0]))
    with pytest.raises(ValueError, match="at least 1 x 1"):
        grid_positions(0, 3)


@pytest.mark.parametrize("sink", [True, False])
def test_goat2d_log_prior_equals_the_2d_formula(sink):
    prior = random_goat2d(sink=sink)
    q_pos, k_pos = grid_positions(3, 4), grid_positions(5, 2)  # different grids: unequal displacements
    with torch.no_grad():
        expected = goat2d_by_hand(prior, q_pos.tolist(), k_pos.tolist())
        assert torch.allclose(prior.log_prior(q_pos, k_pos), expected, atol=1e-12)


def test_goat2d_starts_as_standard_attention():
    prior = GOAT2D(2, 3)
    assert torch.equal(prior.log_prior(grid_positions(3, 3), grid_positions(3, 3)), torch.zeros(2, 10, 10))


def test_goat2d_relative_part_is_shift_invariant_on_the_grid():
    prior = random_goat2d(sink=False)
    with torch.no_grad():
        prior.cls_bias.zero_()
    K = prior.log_prior(grid_positions(6, 6), grid_positions(6, 6))[:, 1:, 1:].reshape(3, 6, 6, 6, 6)
    # query (1, 2) -> key (3, 0) has the displacement of query (2, 4) -> key (4, 2)
    assert torch.allclose(K[:, 1, 2, 3, 0], K[:, 2, 4, 4, 2], atol=1e-12)


def fold_product(prior, q_pos, k_pos):
    lanes = prior.fold(q_pos, k_pos)
    assert lanes.slope is None
    return lanes.q @ lanes.k.transpose(-1, -2) + lanes.key_bias[..., None, :], lanes


@pytest.mark.parametrize("sink", [True, False])
def test_goat2d_fold_equals_log_prior_exactly(sink):
    prior = random_goat2d(sink=sink)
    q_pos, k_pos = grid_positions(3, 3), grid_positions(4, 5)
    folded, lanes = fold_product(prior, q_pos, k_pos)
    assert torch.allclose(folded, prior.log_prior(q_pos, k_pos), atol=1e-12)
    assert lanes.width == prior.fold_width == 4 * 2 + 1


def test_goat2d_folds_only_without_a_causal_mask():
    assert GOAT2D(2).can_fold(causal=False) and not GOAT2D(2).can_fold(causal=True)
    assert not ALiBi2D(2).can_fold(causal=False)


def test_alibi2d_is_minus_slope_times_euclidean_distance():
    prior = ALiBi2D(2).double()
    pos = grid_positions(3, 4)
    K = prior.log_prior(pos, pos)
    q, k = 1 + 1 * 4 + 3, 1 + 2 * 4 + 0  # patches (1, 3) and (2, 0)
    assert K[1, q, k].item() == pytest.approx(-prior.slopes[1].item() * math.hypot(1, 3))
    assert torch.equal(K[:, 0], torch.zeros(2, 13)) and torch.equal(K[:, :, 0], torch.zeros(2, 13))


def grads_of(backend, q, k, v, prior, pos):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = priorattn.attention(*leaves, prior=prior, causal=False, q_pos=pos, k_pos=pos, backend=backend)
    weights = torch.linspace(-1, 1, out.numel(), dtype=torch.float64).view_as(out)
    params = list(prior.parameters())
    grads = torch.autograd.grad((out.double() * weights).sum(), leaves + params, allow_unused=True)
    return out, [torch.zeros_like(x) if g is None else g for x, g in zip(leaves + params, grads)]


ROUTES = [
    ("goat2d", "sdpa"),  # folded into q/k lanes
    ("goat2d", "memeff"),
    ("goat2d", "auto"),
    ("alibi2d", "memeff"),  # no fold: dense tiles
    ("alibi2d", "auto"),
]


@pytest.mark.parametrize("prior_name, backend", ROUTES)
@pytest.mark.parametrize("grid", [(4, 4), (3, 5), (12, 12)])
def test_routes_match_the_reference_forward_and_backward(prior_name, backend, grid):
    prior = random_goat2d() if prior_name == "goat2d" else ALiBi2D(3).double()
    pos = grid_positions(*grid)
    gen = torch.Generator().manual_seed(sum(grid))
    q, k, v = (torch.randn(2, 3, len(pos), 8, generator=gen, dtype=torch.float64) for _ in range(3))
    ref_out, ref_grads = grads_of("reference", q, k, v, prior, pos)
    out, grads = grads_of(backend, q, k, v, prior, pos)
    assert torch.allclose(out, ref_out, atol=1e-10)
    for g, r in zip(grads, ref_grads, strict=True):
        assert torch.allclose(g, r, atol=1e-9)
