"""Experiment 4: the sorted-cache decode against exact attention, over context lengths."""

from __future__ import annotations

import pytest
import torch
from factories import figure_title
from test_scalar_exp_capture import tiny_gpt

from priorattn.figures import RunScale
from priorattn.studies.scalar.capture import capture_scalar_layers
from priorattn.studies.scalar.context_length import (
    decode_errors,
    expectation,
    length_sweep,
    plot_context_length,
)


@pytest.mark.parametrize("attention", ["scalar", "hybrid"])
def test_a_window_holding_every_key_is_exact(attention):
    c = capture_scalar_layers(tiny_gpt(attention), torch.randint(0, 32, (2, 12)))[1]
    errors = decode_errors(c, queries=4, ks=(12,))
    assert errors["missed"].max() < 1e-12
    assert errors["output_error"].max() < 1e-12
    assert (errors["bound"] == 0).all()


@pytest.mark.parametrize("attention", ["scalar", "hybrid"])
def test_the_decode_attends_over_the_k_nearest_keys_renormalized(attention):
    """The output error is that of the k keys nearest in scalar distance with their weights
    renormalized, so ``missed`` is the mass of the window the cache actually reads."""
    c = capture_scalar_layers(tiny_gpt(attention, tau_init=5.0), torch.randint(0, 32, (2, 14)))[0]
    k, queries = 3, 5
    errors = decode_errors(c, queries, ks=(k,))
    L = c.length
    for b in range(2):
        for r, t in enumerate(range(L - queries, L)):
            weights, _ = c.weights(torch.tensor([t]))
            w = weights[b, :, 0, : t + 1]  # (H, t + 1)
            d = (c.q_s[b, :, t, None] - c.k_s[b, :, : t + 1]).abs().double()
            nearest = d.topk(k, largest=False).indices
            kept = torch.zeros_like(w).scatter(1, nearest, w.gather(1, nearest))
            v = (
                c.v[b, :, : t + 1].double().repeat_interleave(c.layer.num_heads // c.v.shape[1], 0)
            )  # (H, t+1, D)
            windowed = torch.einsum("hj,hjd->hd", kept / kept.sum(1, keepdim=True), v)
            exact = torch.einsum("hj,hjd->hd", w, v)
            expected = (windowed - exact).norm(dim=1) / exact.norm(dim=1)
            torch.testing.assert_close(errors["output_error"][0, b, :, r], expected)
            torch.testing.assert_close(errors["missed"][0, b, :, r], 1 - w.gather(1, nearest).sum(1))
    assert (errors["missed"] <= errors["bound"] + 1e-12).all()
    assert (errors["missed"] > 0).any()


def test_bandwidth_keys_count_keys_within_sqrt_tau():
    c = capture_scalar_layers(tiny_gpt("scalar"), torch.randint(0, 32, (1, 8)))[0]
    errors = decode_errors(c, queries=1, ks=(2,))
    d = (c.q_s[0, :, 7, None] - c.k_s[0]).abs()
    expected = (d < c.tau[0, :, 7, None].sqrt()).sum(1).double()
    torch.testing.assert_close(errors["bandwidth_keys"][0, :, 0], expected)


def test_a_sink_is_refused_and_queries_are_checked():
    c = capture_scalar_layers(tiny_gpt("scalar", sink=True), torch.randint(0, 32, (1, 8)))[0]
    with pytest.raises(ValueError, match="without a sink"):
        decode_errors(c, 2)
    c = capture_scalar_layers(tiny_gpt("scalar"), torch.randint(0, 32, (1, 8)))[0]
    with pytest.raises(ValueError, match="queries must be in"):
        decode_errors(c, 9)


def test_length_sweep_records_and_figure(tmp_path):
    def windows_at(length):
        return torch.randint(0, 32, (2, length))

    records = length_sweep(
        tiny_gpt("hybrid"), windows_at, lengths=(8, 32), ks=(2, 4), queries=3, progress=False
    )
    assert [r["length"] for r in records] == [8, 32]
    assert set(records[0]["k"]) == {"2", "4"} and len(records[0]["layers"]) == 2
    for r in records:
        wide, narrow = r["k"]["4"]["missed"]["mean"], r["k"]["2"]["missed"]["mean"]
        assert 0 <= wide <= narrow <= 1
    run = RunScale(2, 300, 0.01)
    path = plot_context_length(
        {"hybrid": records, "again": records}, tmp_path, expectation(records, run), run=run
    )
    assert path.stat().st_size > 10_000 and figure_title(path).startswith("SMOKE RUN (budget 0.01)")
