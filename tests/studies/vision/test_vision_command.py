"""``python -m priorattn vision`` end to end at a tiny budget, on IDX files the tests write."""

from __future__ import annotations

import json

import numpy as np
import pytest
from factories import exit_code, figure_title
from idx_fixtures import write_idx

from priorattn import cli
from priorattn.figures import RunScale
from priorattn.studies.vision.experiment import VisionConfig, accuracy_expectation, locality_expectation


def run_vision(out, data, *models: str, seed: int = 0) -> dict:
    argv = ["vision", "--out", str(out), "--data", str(data), "--budget", "0.005", "--seed", str(seed)]
    assert cli.main([*argv, "--quiet", *(["--models", ",".join(models)] if models else [])]) == 0
    return json.loads((out / "results.json").read_text())


def test_vision_writes_accuracy_per_model_and_resolution(fashion_dir, tmp_path, capsys):
    out = tmp_path / "out"
    results = run_vision(out, fashion_dir, "learned", "goat")
    assert list(results["models"]) == ["learned", "goat"]
    for name, result in results["models"].items():
        assert list(result["accuracy"]) == ["28", "42", "56", "84"]
        assert all(0.0 <= acc <= 1.0 for acc in result["accuracy"].values())
        assert result["model"]["position"] == name
        assert (out / f"{name}.safetensors").is_file()
    assert results["config"]["train_images"] == 100 and results["config"]["steps"] == 5
    assert results["scale"] == dict(steps=5, default_steps=500, budget=0.005, up_to=False, smoke=True)
    for plot in ("accuracy.png", "goat_prior.png"):
        assert (out / plot).stat().st_size > 10_000
        assert figure_title(out / plot).startswith("SMOKE RUN (budget 0.005): 5 training steps per model")
    assert "goat     28px" in capsys.readouterr().out


@pytest.mark.slow
def test_vision_trains_every_mechanism_by_default(fashion_dir, tmp_path):
    assert list(run_vision(tmp_path, fashion_dir)["models"]) == ["goat", "rope", "alibi", "learned"]


def test_vision_says_how_to_fetch_missing_data(tmp_path, capsys):
    missing = tmp_path / "no-data"
    assert exit_code(["vision", "--out", str(tmp_path / "out"), "--data", str(missing)]) == 2
    assert f"make fashion-mnist DATA={missing}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_vision_names_a_corrupt_idx_file(fashion_dir, tmp_path, capsys):
    path = fashion_dir / "t10k-images-idx3-ubyte.gz"
    write_idx(path, np.zeros((3, 28), np.uint8))
    assert exit_code(["vision", "--out", str(tmp_path / "out"), "--data", str(fashion_dir)]) == 2
    assert "t10k-images-idx3-ubyte.gz must hold uint8 images (N, rows, cols)" in capsys.readouterr().err


def test_vision_refuses_unknown_models_and_budgets(capsys):
    assert exit_code(["vision", "--out", "x", "--models", "goat,sinusoidal"]) == 2
    assert "unknown model 'sinusoidal'" in capsys.readouterr().err
    assert exit_code(["vision", "--out", "x", "--budget", "0"]) == 2


def test_goat_nosink_is_goat_without_its_key_sink():
    config = VisionConfig(models=["goat_nosink"]).model_config("goat_nosink")
    assert config.position == "goat" and not config.goat_sink
    assert VisionConfig().models == ["goat", "rope", "alibi", "learned"]


def test_vision_is_reproducible_and_takes_a_seed(fashion_dir, tmp_path):
    first = run_vision(tmp_path / "a", fashion_dir, "learned")
    again = run_vision(tmp_path / "b", fashion_dir, "learned")
    assert again["models"]["learned"]["accuracy"] == first["models"]["learned"]["accuracy"]
    other = run_vision(tmp_path / "c", fashion_dir, "learned", seed=1)
    assert (first["config"]["seed"], other["config"]["seed"]) == (0, 1)


def test_budget_scales_steps_and_images():
    small, large = VisionConfig.for_budget(0.1), VisionConfig.for_budget(10)
    assert (small.steps, small.train_images, small.test_images) == (50, 2_000, 200)
    assert (large.steps, large.train_images, large.test_images) == (5_000, 60_000, 10_000)


FULL = RunScale(500, 500, 1.0)


def test_the_accuracy_caption_says_whether_goat_keeps_more_than_the_learned_embeddings():
    def results(goat: float, learned: float) -> dict:
        return {
            name: dict(accuracy={"28": 0.8, "84": acc})
            for name, acc in (("goat", goat), ("learned", learned))
        }

    assert "This run agrees: at 84 pixels GOAT scores 0.500, learned 0.300" in accuracy_expectation(
        results(0.5, 0.3), [28, 84], FULL
    )
    assert "This run differs: at 84 pixels GOAT scores 0.300, learned 0.400" in accuracy_expectation(
        results(0.3, 0.4), [28, 84], FULL
    )
    only_goat = {"goat": dict(accuracy={"28": 0.8, "84": 0.5})}
    assert "This run cannot tell" in accuracy_expectation(only_goat, [28, 84], FULL)


def test_the_prior_caption_says_whether_the_learned_prior_is_local():
    rows, cols = np.indices((5, 5))
    distance = np.hypot(rows - 2, cols - 2)
    local = np.stack([-distance, -distance])[None]  # (layers 1, heads 2, 5, 5): falls away from the centre
    assert "This run agrees: 2 of 2 heads" in locality_expectation(local, FULL)
    ramp = np.stack([cols - 2.0, distance])[None]  # a ramp across the grid, a prior that rises outward
    assert "This run differs: 0 of 2 heads" in locality_expectation(ramp, FULL)
    assert "This run cannot tell" in locality_expectation(local[..., 1:4, 1:4], FULL)
