"""Experiment 2's locality numbers against direct computations, and its figure."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from factories import figure_title
from test_scalar_exp_capture import tiny_gpt

from priorattn.figures import RunScale
from priorattn.studies.scalar.alignment import (
    alignment_summary,
    binned_median,
    layer_alignment,
    plot_alignment,
    rank_correlation,
    weight_distance_pairs,
)
from priorattn.studies.scalar.common import attention_maps


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    rx, ry = x.argsort().argsort(), y.argsort().argsort()
    return float(np.corrcoef(rx, ry)[0, 1])


def test_rank_correlation_is_spearmans_over_the_visible_keys():
    gen = torch.Generator().manual_seed(1)
    weights = torch.rand(3, 7, generator=gen, dtype=torch.float64)
    distances = torch.rand(3, 7, generator=gen, dtype=torch.float64)
    distances[1, 4:] = torch.inf  # row 1 sees 4 keys
    got = rank_correlation(weights, distances)
    for row, n in ((0, 7), (1, 4), (2, 7)):
        assert got[row].item() == pytest.approx(
            spearman(weights[row, :n].numpy(), distances[row, :n].numpy())
        )


def test_pure_scalar_heads_are_perfectly_local():
    """Without a sink the weight is exp(-d^2 / tau) / Z: it falls with distance alone (distinct
    tokens, so no two keys of the first layer tie; a wide tau, so no weight underflows to a tie at 0)."""
    model = tiny_gpt("scalar", tau_init=20.0)
    tokens = torch.stack([torch.randperm(32)[:16] for _ in range(2)])
    assert layer_alignment(attention_maps(model, tokens)[0])["rank_correlation"] == pytest.approx(-1.0)
    summary = alignment_summary(attention_maps(model, tokens))
    assert list(summary["nearest_mass"]) == ["1", "2", "4", "8"]  # k below the window length
    masses = list(summary["nearest_mass"].values())
    assert masses == sorted(masses) and 0 < masses[0] < masses[-1] < 1


@pytest.mark.parametrize("attention", ["scalar", "hybrid"])
def test_l_align_is_the_regularizers_own_term(attention):
    model = tiny_gpt(attention)
    tokens = torch.randint(0, 32, (2, 16))
    captures = attention_maps(model, tokens)
    model.train()
    layers = [block.attn for block in model.blocks]
    for layer in layers:
        layer.track = ("align",)
    with torch.no_grad():
        model(tokens)
    for layer, attention in zip(layers, captures):
        assert layer_alignment(attention)["l_align"] == pytest.approx(float(layer.terms["align"]), rel=1e-9)


def test_pairs_are_every_visible_pair_with_distance_in_key_deviations():
    model = tiny_gpt("hybrid")
    captures = attention_maps(model, torch.randint(0, 32, (2, 6)))
    weights, distances = weight_distance_pairs(captures)
    assert weights.shape == distances.shape == (2 * 2 * 4 * 21,)  # layers x windows x heads x pairs
    c = captures[0]
    std = c.k_s.double().std(dim=(0, 2))[0]
    # The first pair: layer 0, window 0, head 0, query 0 against its only visible key, itself.
    assert weights[0] == pytest.approx(1.0)
    assert distances[0] == pytest.approx(float((c.q_s[0, 0, 0] - c.k_s[0, 0, 0]).abs() / std))


def test_binned_median_skips_empty_bins():
    centres, medians = binned_median(
        np.array([0.1, 0.2, 0.3, 2.5]), np.array([1.0, 3.0, 2.0, 7.0]), np.arange(4.0)
    )
    assert centres.tolist() == [0.5, 2.5] and medians.tolist() == [2.0, 7.0]


def test_alignment_figure_is_written(tmp_path):
    captures = attention_maps(tiny_gpt("hybrid"), torch.randint(0, 32, (1, 10)))
    summary = alignment_summary(captures)
    assert len(summary["layers"]) == 2 and list(summary["nearest_mass"]) == ["1", "2", "4", "8"]
    weights, distances = weight_distance_pairs(captures)
    drawn = {"a": (weights, distances, summary), "b": (weights, distances, summary)}
    path = plot_alignment(drawn, tmp_path, "This run agrees.", run=RunScale(2, 300, 0.01))
    assert path.name == "alignment.png" and path.stat().st_size > 10_000
    assert figure_title(path).startswith("SMOKE RUN (budget 0.01): 2 training steps per model")
