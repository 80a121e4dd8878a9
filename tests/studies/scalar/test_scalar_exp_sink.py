"""Experiment 5: the sink's mass and where it comes from."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from factories import figure_title
from test_scalar_exp_capture import tiny_gpt

from priorattn.eval.ppl import pick_windows
from priorattn.figures import RunScale
from priorattn.studies.scalar import sink
from priorattn.studies.scalar.capture import capture_scalar_layers


def test_sink_mass_in_row_blocks_is_the_sink_column_of_the_dense_softmax(monkeypatch):
    model = tiny_gpt("hybrid", sink=True)
    c = capture_scalar_layers(model, torch.randint(0, 32, (2, 10)))[1]
    monkeypatch.setattr(sink, "ROWS_PER_BLOCK", 3)
    mass = sink.sink_mass(c)
    b, h, i = 1, 3, 7
    logits = torch.cat(
        [
            -((c.q_s[b, h, i] - c.layer.sink_key) ** 2).view(1) / c.tau[b, h, i],
            -((c.q_s[b, h, i] - c.k_s[b, h, : i + 1]) ** 2) / c.tau[b, h, i]
            + c.q[b, h, i] @ c.k[b, h, : i + 1].T / c.q.shape[-1] ** 0.5,
        ]
    )
    assert mass.shape == (2, 4, 10)
    torch.testing.assert_close(mass[b, h, i], torch.softmax(logits.double(), 0)[0])


def test_nearest_key_distance_is_in_bandwidths():
    c = capture_scalar_layers(tiny_gpt("scalar", sink=True), torch.randint(0, 32, (1, 6)))[0]
    got = sink.nearest_key_distance(c)
    i, h = 4, 1
    expected = (c.q_s[0, h, i] - c.k_s[0, h, : i + 1]).abs().min() / c.tau[0, h, i].sqrt()
    assert got[0, h, i].item() == pytest.approx(expected.item())


def test_queries_near_sink_counts_queries_within_one_bandwidth_of_its_key():
    c = capture_scalar_layers(tiny_gpt("scalar", tau_init=30.0), torch.randint(0, 32, (2, 9)))[0]
    expected = ((c.q_s.abs() < c.tau.sqrt()).double().mean()).item()  # no sink: the key 0
    assert 0 < expected < 1
    assert sink.queries_near_sink(c) == pytest.approx(expected)


def test_binned_means_leaves_empty_bins_empty():
    x, y = torch.tensor([0.1, 0.3, 5.0]), torch.tensor([1.0, 3.0, 4.0])
    assert sink.binned_means(x, y, (0.0, 1.0, 2.0, np.inf)) == [2.0, None, 4.0]


def test_summary_by_position_and_length(tmp_path):
    model = tiny_gpt("scalar", sink=True)
    documents = [np.random.default_rng(0).integers(0, 32, 100)]
    windows = {n: torch.from_numpy(np.stack(pick_windows(documents, n, 2, 0)))[:, :n] for n in (8, 16)}
    records = sink.sink_by_length(model, windows.get, lengths=(8, 16))
    first = records[0]
    assert [r["length"] for r in records] == [8, 16]
    assert first["position_edges"] == [1, 2, 4, 9] and len(first["by_position"]) == 3
    captures = capture_scalar_layers(model, windows[8])
    masses = torch.stack([sink.sink_mass(c) for c in captures])  # (layers, B, H, L)
    assert first["by_position"][0] == pytest.approx(float(masses[..., 0].mean()))
    assert first["by_position"][2] == pytest.approx(float(masses[..., 3:8].mean()))
    assert first["mean"] == pytest.approx(float(masses.mean()))
    assert first["layers"][1]["heads"] == pytest.approx(masses[1].mean(dim=(0, 2)).tolist())
    tau = {"sink": ([1, 2, 3], [0.1, 0.2, 0.3]), "no sink": ([1, 2, 3], [0.1, 0.1, 0.1])}
    path = sink.plot_sink({"sink": records}, tau, tmp_path, run=RunScale(2, 300, 0.01))
    assert path.stat().st_size > 10_000 and figure_title(path).startswith("SMOKE RUN (budget 0.01)")


def test_a_model_without_a_sink_is_refused():
    c = capture_scalar_layers(tiny_gpt("scalar"), torch.randint(0, 32, (1, 4)))[0]
    with pytest.raises(ValueError, match="no sink"):
        sink.sink_mass(c)
