"""The ViT and its position mechanisms: 2D RoPE, resampled learned embeddings, any resolution."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from priorattn import PriorMultiheadAttention
from priorattn.encodings import RoPE
from priorattn.studies.vision import GOAT2D, POSITIONS, RoPE2D, ViT, ViTConfig, grid_positions
from priorattn.studies.vision.experiment import centre_log_priors
from priorattn.studies.vision.positions import unpack_positions

SMALL = dict(d_model=48, n_layers=2, n_heads=2, mlp_hidden=32, goat_freqs=2)


@pytest.mark.parametrize("position", POSITIONS)
def test_vit_runs_at_every_multiple_of_the_patch(position):
    model = ViT(ViTConfig(position, **SMALL))
    for size in (28, 42, 84):
        logits = model(torch.randn(2, 1, size, size))
        assert logits.shape == (2, 10) and torch.isfinite(logits).all()


def test_vit_refuses_an_image_the_patches_do_not_tile():
    with pytest.raises(ValueError, match="image size 30 is not a multiple of patch_size=7"):
        ViT(ViTConfig("goat", **SMALL))(torch.randn(1, 1, 30, 30))
    with pytest.raises(ValueError, match=r"images must be \(B, 1, S, S\)"):
        ViT(ViTConfig("goat", **SMALL))(torch.randn(1, 28, 28))
    with pytest.raises(
        ValueError, match="unknown grid position 'sinusoidal': use one of goat, rope, alibi, learned"
    ):
        ViTConfig("sinusoidal")


def test_goat_vit_folds_its_prior_into_each_head():
    model = ViT(ViTConfig("goat", d_model=96, n_heads=3, goat_freqs=3))
    attn = model.blocks[0].attn
    assert isinstance(attn.prior, GOAT2D) and attn.prior.can_fold(causal=False)
    assert attn.content_dim == 32 - (4 * 3 + 1)  # seed 000 Algorithm 1: d_c = d_h - d_p
    assert len(model.priors()) == model.config.n_layers


def test_goat_vit_output_does_not_depend_on_the_route():
    torch.manual_seed(0)
    model = ViT(ViTConfig("goat", **SMALL)).double()
    with torch.no_grad():
        for prior in model.priors():
            for p in prior.parameters():
                p.uniform_(-0.5, 0.5)
    images = torch.randn(2, 1, 28, 28, dtype=torch.float64)
    outputs = {}
    for backend in ("reference", "sdpa", "memeff"):
        for block in model.blocks:
            block.attn.backend = backend
        outputs[backend] = model(images)
    assert torch.allclose(outputs["sdpa"], outputs["reference"], atol=1e-10)
    assert torch.allclose(outputs["memeff"], outputs["reference"], atol=1e-10)


def test_rope2d_scores_depend_on_the_2d_displacement_only():
    rope = RoPE2D(8)
    q, k = torch.randn(1, 1, 1, 8).double(), torch.randn(1, 1, 1, 8).double()

    def score(query: tuple[int, int], key: tuple[int, int]) -> float:
        (qy, qx), (ky, kx) = query, key
        pos_q, pos_k = grid_positions(20, 20)[1 + qy * 20 + qx], grid_positions(20, 20)[1 + ky * 20 + kx]
        return float((rope(q, pos_q[None]) * rope(k, pos_k[None])).sum())

    assert score((1, 2), (4, 7)) == pytest.approx(score((9, 3), (12, 8)), abs=1e-12)
    assert score((1, 2), (4, 7)) != pytest.approx(score((1, 2), (7, 4)), abs=1e-6)  # rows != columns


def test_rope2d_turns_the_first_half_by_rows_and_the_second_by_columns_in_a_layer():
    """The layer's rotated keys: a 1D RoPE of half the width on each half, by row and by column."""
    rope = RoPE2D(8)
    module = PriorMultiheadAttention(16, 2, encoding=rope, causal=False).double()
    x, positions = torch.randn(1, 10, 16, dtype=torch.float64), grid_positions(3, 3)
    _, cache = module(x, positions=positions)
    k = module.k_proj(x).view(1, 10, 2, 8).transpose(1, 2)
    grid, axis = unpack_positions(positions), RoPE(4, base=rope.base)
    expected = torch.cat([axis(k[..., :4], grid.row), axis(k[..., 4:], grid.col)], dim=-1)
    torch.testing.assert_close(cache.k, expected, rtol=0, atol=1e-15)


def test_rope2d_leaves_the_class_token_unrotated():
    x = torch.randn(1, 2, 3, 8)
    out = RoPE2D(8)(x, grid_positions(1, 2))
    assert torch.equal(out[:, :, 0], x[:, :, 0])


def test_rope2d_needs_lanes_in_fours():
    with pytest.raises(ValueError, match="multiple of 4"):
        RoPE2D(6)


def test_learned_embeddings_are_resampled_bicubically_to_other_grids():
    model = ViT(ViTConfig("learned", **SMALL))
    assert torch.equal(model.position_embedding(4, 4), model.pos_embed.flatten(2).transpose(1, 2))
    expected = F.interpolate(model.pos_embed, size=(12, 12), mode="bicubic", align_corners=False)
    assert torch.equal(model.position_embedding(12, 12), expected.flatten(2).transpose(1, 2))
    with torch.no_grad():
        model.pos_embed.fill_(0.25)
    assert torch.allclose(model.position_embedding(6, 6), torch.full((1, 36, 48), 0.25))


def test_centre_log_priors_are_each_layers_prior_from_the_centre_patch():
    model = ViT(ViTConfig("goat", **SMALL))
    with torch.no_grad():
        for prior in model.priors():
            for p in prior.parameters():
                p.uniform_(-0.5, 0.5)
    maps = centre_log_priors(model, 5)
    assert maps.shape == (2, 2, 5, 5) and np.all(maps[:, :, 2, 2] == 0.0)
    pos = grid_positions(5, 5)
    centre, key = pos[1 + 2 * 5 + 2], pos[1 + 4 * 5 + 1]  # patches (2, 2) and (4, 1)
    K = model.priors()[1].log_prior(centre[None], torch.stack([centre, key]))[:, 0].detach()
    assert np.allclose(maps[1, :, 4, 1], (K[:, 1] - K[:, 0]).numpy(), atol=1e-6)
