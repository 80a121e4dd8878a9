"""seed 004 Sec. 5-7 on the attention layers of trained runs: ``analyze identities`` and its parts."""

from __future__ import annotations

import json
import math

import pytest
import torch
from factories import exit_code

from priorattn import cli
from priorattn.analysis.identities import (
    IDENTITIES,
    LayerScores,
    Residuals,
    add_row_matrices,
    capture_scores,
    check_layers,
)
from priorattn.train import load_run


@pytest.mark.parametrize("prior", ["uniform", "goat", "alibi+ggd"])
def test_identities_hold_on_every_layer_of_a_trained_run(make_run, tmp_path, capsys, prior):
    run_dir = make_run(prior=prior, ssmax=prior == "alibi+ggd")
    out = tmp_path / "identities"
    assert cli.main(["analyze", "identities", "--run", str(run_dir), "--out", str(out), "--rows", "3"]) == 0
    result = json.loads((out / "results.json").read_text())
    assert set(result["residuals"]) == set(IDENTITIES)
    for name, residual in result["residuals"].items():
        assert residual["relative"] < 1e-9, name
        assert residual["absolute"] == pytest.approx(residual["relative"] * residual["scale"], rel=1e-12)
        assert residual["scale"] > 0, name  # every identity compared something non-zero
        assert 0 < residual["smallest_weight"] < 1, name
    assert result["layers"] == [0, 1] and result["heads"] == [0, 1] and result["tokens"] == [2, 33]
    printed = capsys.readouterr().out
    assert all(name in printed for name in IDENTITIES)


def test_capture_leaves_the_model_unchanged(make_run):
    run = load_run(make_run(prior="goat"))
    model = run.model.double()
    tokens = torch.randint(0, 256, (2, 17))
    expected = model(tokens[:, :-1], targets=tokens[:, 1:])[1].item()
    loss, layers = capture_scores(model, tokens)
    assert loss == pytest.approx(expected, rel=1e-12)
    assert [block.attn.normalizer for block in model.blocks] == ["softmax", "softmax"]
    assert all(layer.p.shape == (2, 2, 16, 16) and layer.s.dtype == torch.float64 for layer in layers)
    assert all(layer.utility.abs().max() > 0 for layer in layers)


def test_wrong_scores_temperature_or_sign_break_the_identities(make_run):
    """The checks can fail: scores that are not the layer's, a doubled temperature, or utilities of
    the wrong sign give residuals of order one in the identities that involve them."""
    run = load_run(make_run(prior="goat"))
    tokens = torch.randint(0, 256, (1, 17))
    _, layers = capture_scores(run.model.double(), tokens)

    def residuals(change):
        altered = [LayerScores(**(vars(layer) | change(layer))) for layer in layers]
        report = check_layers(altered, [0, 1], 3, torch.Generator().manual_seed(0))["residuals"]
        return {name: residual["relative"] for name, residual in report.items()}

    result = residuals(lambda x: dict(s=10 * x.s))
    assert all(result[name] > 1e-3 for name in ("fisher", "hessian")), result  # vs < 1e-9 when right
    result = residuals(lambda x: dict(tau=2 * x.tau))
    assert all(result[name] > 0.1 for name in ("advantage", "score_gradient_fisher")), result
    result = residuals(lambda x: dict(utility=-x.utility))
    assert all(result[name] > 1 for name in ("advantage", "score_gradient_fisher", "natural_gradient")), (
        result
    )


def test_a_nan_residual_is_reported_not_dropped():
    residuals = Residuals()
    residuals.add("fisher", torch.tensor([1.0, float("nan")]), torch.ones(2), torch.ones(2))
    residuals.add("fisher", torch.ones(2), torch.ones(2), torch.ones(2))
    assert math.isnan(residuals.report()["fisher"]["relative"])


def test_natural_gradient_stays_at_rounding_with_weights_down_to_1e_30():
    """Rows whose far keys weigh down to 1e-30 (a GOAT prior's slope): every identity, the natural
    gradient's included, holds to float64 rounding, and each reports that smallest weight."""
    tau, L = 4.0, 16
    decay = math.log(1e30) / (L - 1)  # the last row's first key weighs about 1e-30
    lags = (torch.arange(L)[:, None] - torch.arange(L)[None, :]).double()
    visible = lags >= 0
    gen = torch.Generator().manual_seed(0)
    noise = torch.rand(L, L, generator=gen, dtype=torch.float64)
    s = (-tau * decay * lags + noise).masked_fill(~visible, -math.inf)[None, None].requires_grad_()
    p = torch.softmax(s / tau, dim=-1)
    p.retain_grad()
    utility = torch.randn(1, 1, L, L, generator=gen, dtype=torch.float64)
    (-(p * utility).sum() + 0.5 * p.square().sum()).backward()  # u = -dL/dp = utility - p
    layer = LayerScores(tau, s.detach(), p.detach(), s.grad, -p.grad, visible[None, None])
    residuals = Residuals()
    for i in range(L):
        add_row_matrices(residuals, layer, 0, 0, i)
    report = residuals.report()
    assert report["natural_gradient"]["smallest_weight"] < 1e-29
    for name in ("fisher", "hessian", "score_gradient_fisher", "natural_gradient"):
        assert report[name]["relative"] < 1e-13, (name, report[name])


def test_first_query_row_with_one_key_is_checked(make_run):
    """Row 0 under a causal mask sees one key: F = 0, every identity holds trivially and finitely."""
    _, layers = capture_scores(load_run(make_run(prior="goat")).model.double(), torch.randint(0, 256, (1, 9)))
    residuals = Residuals()
    for layer in layers:
        add_row_matrices(residuals, layer, 0, 0, 0)
        add_row_matrices(residuals, layer, 0, 1, 5)
    assert all(residual["relative"] < 1e-9 for residual in residuals.report().values())


@pytest.mark.parametrize(
    "args, message",
    [
        (["--run", "{missing}"], "holds no run"),
        (["--run", "{no_checkpoint}"], "no checkpoint"),
        (["--run", "{run}", "--layers", "0,2"], "layer 2 is out of range: the model has 2 layers"),
        (["--run", "{run}", "--heads", "5"], "head 5 is out of range: the model has 2 heads"),
        (["--run", "{run}", "--heads", "-1"], "argument --heads: must be an integer >= 0"),
        (["--run", "{sparse}"], "are those of softmax attention; .* uses normalizer='sparsemax'"),
        (["--run", "{run}", "--out", "{file}"], "is a file"),
    ],
)
def test_bad_input_is_a_one_line_error(make_run, tmp_path, capsys, args, message):
    run_dir = make_run(prior="goat")
    (tmp_path / "no_checkpoint").mkdir()
    (tmp_path / "no_checkpoint" / "config.json").write_text((run_dir / "config.json").read_text())
    (tmp_path / "file").write_text("")
    paths = dict(
        missing=tmp_path / "missing",
        no_checkpoint=tmp_path / "no_checkpoint",
        run=run_dir,
        sparse=make_run(prior="goat", normalizer="sparsemax"),
        file=tmp_path / "file",
    )
    argv = ["analyze", "identities", "--out", str(tmp_path / "out"), *args]
    argv = [a.format(**{k: str(v) for k, v in paths.items()}) for a in argv]
    assert exit_code(argv) == 2
    import re

    assert re.search(message, capsys.readouterr().err)


def test_train_rejects_entmax_alpha_at_most_one(tmp_path, capsys):
    assert exit_code(["train", "--normalizer", "1", "--steps", "1", "--out", str(tmp_path / "r")]) == 2
    assert "entmax alpha must be a finite number > 1" in capsys.readouterr().err
