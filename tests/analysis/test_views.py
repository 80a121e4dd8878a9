"""``priorattn analyze priors / sink-mass / attention`` on tiny trained runs: the numbers behind each
figure against the priors and the model computed directly here."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from factories import exit_code

from priorattn import cli
from priorattn.analysis import plots
from priorattn.analysis.plots import (
    causal_prior_probs,
    goat_components,
    identified_goat_components,
    illustrative_goat,
    spike_sink,
)
from priorattn.analysis.trained import attention_weights
from priorattn.analysis.views import (
    goat_with_sink,
    head_label,
    head_parameters,
    sink_mass,
    uniform_share,
)
from priorattn.priors import GGD, GOAT, ALiBi, Sum, Uniform
from priorattn.train import load_run


def results(out):
    return json.loads((out / "results.json").read_text())


def analyze(*argv) -> None:
    assert cli.main(["analyze", *map(str, argv)]) == 0


@pytest.fixture
def unsaved(monkeypatch):
    """Figures are built but not rendered to PNG (rendering is most of a view's time)."""
    monkeypatch.setattr(plots, "save", lambda fig, path: path)


# ---------------------------------------------------------------------------------------------
# analyze priors


def test_priors_view_reports_the_learned_ggd_parameters(make_run, tmp_path, unsaved):
    run_dir = make_run(prior="alibi+ggd", ssmax=True)
    analyze("priors", "--run", run_dir, "--out", tmp_path)
    result = results(tmp_path)
    model = load_run(run_dir).model
    assert [entry["layer"] for entry in result["layers"]] == [0, 1]
    for entry in result["layers"]:
        alibi, ggd = model.blocks[entry["layer"]].attn.prior.parts
        for head in entry["heads"]:
            h = head["head"]
            beta, theta_alpha = ggd.theta_beta[h].item(), ggd.theta_alpha[h].item()
            assert head["ggd_shape_beta"] == pytest.approx(beta, rel=1e-6)  # seed 003 App. C
            assert head["ggd_width_tokens"] == pytest.approx(math.exp(-theta_alpha / beta), rel=1e-6)
            assert head["ggd_centre_tokens"] == pytest.approx(2 * math.sinh(ggd.theta_mu[h].item()), abs=1e-9)
            assert head["alibi_slope"] == pytest.approx(alibi.slopes[h].item())
    assert result["figures"] == ["prior_curves.png", "prior_heatmaps.png"]  # no sink without GOAT


def test_priors_view_draws_the_goat_sink_far_past_the_training_length(make_run, tmp_path):
    run_dir = make_run(prior="goat")
    analyze(
        "priors", "--run", run_dir, "--out", tmp_path, "--layers", "1", "--heads", "0", "--extrapolate", "4"
    )
    result = results(tmp_path)
    positions = torch.tensor(result["sink_positions"])
    assert (
        result["train_len"] == 32
        and positions.max() == 4 * 32 - 1
        and (positions[:32] == torch.arange(32)).all()
    )
    (entry,) = result["layers"]
    assert entry["layer"] == 1 and [h["head"] for h in entry["heads"]] == [0]
    goat = load_run(run_dir).model.double().blocks[1].attn.prior
    with torch.no_grad():
        u = goat.sink(positions)[0]  # u_0(j), seed 000 Eq. 19
    assert torch.tensor(entry["sink"][0], dtype=torch.float64) == pytest.approx(u, abs=1e-12)
    assert entry["heads"][0]["goat_sink_spike"] == pytest.approx((u[0] - u[1]).item(), abs=1e-12)
    decomposition = "goat_decomposition_layer1_head0.png"  # seed 000 Fig. 1 of the learned head
    assert result["figures"] == ["prior_curves.png", "prior_heatmaps.png", decomposition, "sink.png"]
    assert all((tmp_path / name).stat().st_size > 0 for name in result["figures"])
    expected = identified_goat_components(*goat_components(goat, 32, head=0))[0]
    assert entry["identified_sink"][0] == pytest.approx(expected.tolist(), abs=1e-12)


@pytest.mark.parametrize("beta", [0.0, 1e-4])
def test_a_flat_ggd_has_no_finite_width(beta):
    prior = GGD(1)
    with torch.no_grad():
        prior.theta_alpha.fill_(-1.0)
        prior.theta_beta.fill_(beta)  # width exp(1 / beta): beyond any float
    params = head_parameters(prior, 0)
    assert params["ggd_width_tokens"] is None and params["ggd_shape_beta"] == pytest.approx(beta)
    assert "width unbounded" in head_label(0, params)


def test_priors_view_refuses_a_run_without_a_prior(make_run, tmp_path, capsys):
    assert exit_code(["analyze", "priors", "--run", str(make_run()), "--out", str(tmp_path)]) == 2
    assert "has no prior to draw (prior='uniform')" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# Bad input, every view


@pytest.fixture
def run_without_checkpoint(make_run, tmp_path):
    """A copy of a run's directory with its config, data record and no checkpoint."""
    source, copy = make_run(prior="goat"), tmp_path / "no-checkpoint"
    copy.mkdir()
    for name in ("config.json", "data.json"):
        shutil.copy(source / name, copy / name)
    return copy


def view_args(view: str, run_dir, out) -> list[str]:
    extra = {"attention": ["--prompt", "to be", "--layer", "0", "--head", "0"]}.get(view, [])
    return ["analyze", view, "--run", str(run_dir), "--out", str(out), *extra]


@pytest.mark.parametrize("view", ["priors", "sink-mass", "attention"])
def test_views_name_a_missing_checkpoint(run_without_checkpoint, tmp_path, capsys, view):
    assert exit_code(view_args(view, run_without_checkpoint, tmp_path / "out")) == 2
    assert f"no checkpoint in {run_without_checkpoint}" in capsys.readouterr().err


@pytest.mark.parametrize("view", ["priors", "sink-mass", "attention"])
def test_views_name_a_directory_without_a_run(tmp_path, capsys, view):
    assert exit_code(view_args(view, tmp_path, tmp_path / "out")) == 2
    assert "holds no run (config.json is missing)" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["priors", "--layers", "0,2"], "layer 2 is out of range: the model has 2 layers (0 to 1)"),
        (["priors", "--heads", "5"], "head 5 is out of range: the model has 2 heads (0 to 1)"),
        (["attention", "--prompt", "to be", "--layer", "2", "--head", "0"], "layer 2 is out of range"),
        (["attention", "--prompt", "to be", "--layer", "0", "--head", "2"], "head 2 is out of range"),
        (["attention", "--prompt", "", "--layer", "0", "--head", "0"], "prompt is empty"),
        (["sink-mass", "--omegas", "0,-1"], "must be a number >= 0, got -1"),
        (["sink-mass", "--omegas", "0,x"], "expected a number, got 'x'"),
    ],
)
def test_views_reject_bad_indices_prompts_and_omegas(make_run, tmp_path, capsys, argv, message):
    view, *options = argv
    argv = ["analyze", view, "--run", str(make_run(prior="goat")), "--out", str(tmp_path), *options]
    assert exit_code(argv) == 2
    assert message in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# Sink mass (seed 000 Thm. 5.1)


@torch.no_grad()
def prior_mass_on_key_0(prior, length):
    """The prior's own mean mass on key 0 over queries 1..L-1: its causal softmax, by hand."""
    pos = torch.arange(length)
    return causal_prior_probs(prior.log_prior(pos, pos).double())[:, 1:, 0].mean(-1)


@pytest.mark.parametrize(
    "prior",
    [Uniform(), ALiBi(3), GGD(3, init="alibi"), illustrative_goat(3, 16)],
    ids=["uniform", "alibi", "ggd", "goat"],
)
def test_sink_mass_starts_at_the_prior_and_stays_within_theorem_5_1(prior):
    omegas = [0.0, 0.01, 0.5, 2.0]
    mass = sink_mass(prior.double(), 16, omegas, samples=4)
    prior_mass = prior_mass_on_key_0(prior.double(), 16)
    assert mass[:, 0] == pytest.approx(prior_mass.expand(mass.shape[0]), rel=1e-12)
    assert mass[:, 1] == pytest.approx(mass[:, 0], rel=0.02)  # tends to the prior as omega -> 0
    for n, omega in enumerate(omegas):  # pi e^-omega <= p <= pi e^omega, so also their means
        assert (mass[:, n] >= prior_mass * math.exp(-omega) * (1 - 1e-12)).all()
        assert (mass[:, n] <= prior_mass * math.exp(omega) * (1 + 1e-12)).all()


def test_goat_sink_sheds_its_mass_as_the_content_signal_grows():
    prior = GOAT(2, sink=True, slope=False, train_len=32).double()
    spike_sink(prior.sink, torch.tensor([8.0, 4.0], dtype=torch.float64))  # u(0) = 8 and 4, else ~0
    omegas = [0.0, 1.0, 4.0, 16.0, 64.0]
    mass = sink_mass(prior, 32, omegas, samples=8)
    assert (mass[:, 0] > 0.5).all()  # prior-dominated: most of the weight on the sink
    assert (mass.diff(dim=-1) < 0).all()
    assert (mass[:, -1] < mass[:, 0] / 2).all()  # content-driven


def test_uniform_prior_keeps_key_0_at_its_uniform_share_at_every_omega():
    """Content draws are exchangeable over the keys, so key 0 expects 1 / (i + 1) whatever omega."""
    mass = sink_mass(Uniform(), 8, [0.0, 4.0, 64.0], samples=400)
    share = sum(1 / (i + 1) for i in range(1, 8)) / 7
    assert uniform_share(8) == pytest.approx(share, rel=1e-12)
    assert mass[0] == pytest.approx([share] * 3, abs=0.02)


def test_sink_mass_view_draws_one_curve_per_run_of_a_compare_output(make_run, tmp_path):
    goat, alibi = make_run(prior="goat"), make_run(prior="alibi+ggd", ssmax=True)
    compare = tmp_path / "compare"
    (compare / "models").mkdir(parents=True)
    (compare / "models" / "alibi").symlink_to(alibi)
    out = tmp_path / "out"
    analyze("sink-mass", "--run", goat, "--run", compare, "--out", out, "--omegas", "0,2,8", "--samples", "2")
    result = results(out)
    assert result["omegas"] == [0.0, 2.0, 8.0] and "dynamic range" in result["protocol"]
    assert [r["label"] for r in result["runs"]] == ["GOAT prior", "ALiBi + GGD (BAM) prior + SSMax"]
    model = load_run(goat).model.double()
    entry = result["runs"][0]
    for layer in range(2):
        expected = sink_mass(model.blocks[layer].attn.prior, 32, [0.0, 2.0, 8.0], samples=2)
        assert torch.tensor(entry["mass"][layer], dtype=torch.float64) == pytest.approx(expected, rel=1e-12)
    everything = torch.tensor(entry["mass"], dtype=torch.float64).flatten(0, 1)
    assert torch.tensor(entry["mean"], dtype=torch.float64) == pytest.approx(everything.mean(0), rel=1e-12)
    assert (out / "sink_mass.png").stat().st_size > 0


# ---------------------------------------------------------------------------------------------
# analyze attention


def sparsemax_by_hand(z):
    """Euclidean projection of ``z`` onto the simplex (Martins and Astudillo, 2016, Alg. 1)."""
    top = z.sort(descending=True).values
    k = torch.arange(1, len(z) + 1, dtype=z.dtype)
    support = (1 + k * top > top.cumsum(0)).nonzero().max() + 1
    threshold = (top[:support].sum() - 1) / support
    return (z - threshold).clamp_min(0)


def weights_by_hand(run_dir, tokens, layer, head):
    """The layer's attention of ``head`` from its own projections, prior, RoPE and map (softmax or
    sparsemax): the input to the layer is caught by a hook, the rest computed here."""
    model = load_run(run_dir).model.double()
    attn, inputs = model.blocks[layer].attn, []
    attn.register_forward_pre_hook(lambda module, args: inputs.append(args[0]))
    with torch.no_grad():
        model(tokens)
        (x,) = inputs
        L, Dq = tokens.shape[1], attn.content_dim
        q = attn.q_proj(x).view(1, L, attn.num_heads, Dq).transpose(1, 2)[0, head]  # (L, Dq)
        k = attn.k_proj(x).view(1, L, attn.num_kv_heads, Dq).transpose(1, 2)[0, head]
        pos = torch.arange(L)
        if attn.rope is not None:
            q, k = (attn.rope(t[None, None], pos[None])[0, 0] for t in (q, k))
        logits = q @ k.T / math.sqrt(Dq)
        if attn.prior is not None:
            logits = logits + attn.prior.log_prior(pos, pos)[head if attn.prior.num_heads else 0]
        if attn.normalizer == "sparsemax":
            return torch.stack(
                [
                    torch.cat([sparsemax_by_hand(row[: i + 1]), row.new_zeros(L - i - 1)])
                    for i, row in enumerate(logits)
                ]
            )
        future = torch.ones(L, L, dtype=torch.bool).triu(1)
        return torch.softmax(logits.masked_fill(future, -math.inf), dim=-1)


@pytest.mark.parametrize(
    "model",
    [dict(prior="goat"), dict(prior="ggd", encoding="rope"), dict(prior="alibi", normalizer="sparsemax")],
    ids=["goat", "ggd-rope", "alibi-sparsemax"],
)
def test_attention_view_rows_are_the_layers_own_map(make_run, tmp_path, unsaved, model):
    run_dir = make_run(**model)
    prompt = "now is the winter"
    analyze(
        "attention", "--run", run_dir, "--out", tmp_path, "--prompt", prompt, "--layer", "1", "--head", "1"
    )
    result = results(tmp_path)
    weights = torch.tensor(result["weights"], dtype=torch.float64)
    tokens = torch.tensor([result["tokens"]])
    assert result["tokens"] == load_run(run_dir).tokenizer.encode(prompt)
    assert "".join(result["pieces"]) == prompt
    assert weights.shape == (len(prompt), len(prompt))
    assert weights.sum(-1) == pytest.approx(torch.ones(len(prompt), dtype=torch.float64), abs=1e-12)
    assert (weights.triu(1) == 0).all()
    assert weights == pytest.approx(weights_by_hand(run_dir, tokens, layer=1, head=1), abs=1e-12)


def test_ggd_attention_view_names_the_heads_learned_shape(make_run, tmp_path):
    run_dir = make_run(prior="ggd", encoding="rope")
    analyze(
        "attention",
        "--run",
        run_dir,
        "--out",
        tmp_path,
        "--prompt",
        "sun of york",
        "--layer",
        "0",
        "--head",
        "1",
    )
    beta = load_run(run_dir).model.blocks[0].attn.prior.theta_beta[1].item()
    assert results(tmp_path)["prior_parameters"]["ggd_shape_beta"] == pytest.approx(beta, rel=1e-6)
    assert (tmp_path / "attention.png").stat().st_size > 0


def test_attention_weights_leave_the_model_as_it_was(make_run):
    model = load_run(make_run(prior="goat")).model
    tokens = torch.randint(0, 256, (2, 9))
    before = model(tokens)[0]
    weights = attention_weights(model, tokens)
    assert [w.shape for w in weights] == [(2, 2, 9, 9)] * 2
    assert [(b.attn.normalizer, b.attn.backend) for b in model.blocks] == [("softmax", "auto")] * 2
    assert torch.equal(model(tokens)[0], before)


def test_goat_prior_is_found_inside_a_sum():
    goat = GOAT(2)
    assert goat_with_sink(Sum(ALiBi(2), goat)) is goat
    assert goat_with_sink(GOAT(2, sink=False)) is None
