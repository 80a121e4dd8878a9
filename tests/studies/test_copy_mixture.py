"""Seed 000 Fig. 1 on the copy-mixture task: the identified GOAT decomposition, what a head's prior
recovered, the probe model, and ``analyze copy-mixture`` end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from factories import exit_code, figure_title

from priorattn import cli
from priorattn.analysis.plots import (
    causal_prior_probs,
    goat_components,
    identified_goat_components,
    illustrative_goat,
)
from priorattn.priors import GOAT
from priorattn.studies.copy_mixture import (
    FIGURE,
    CopyMixtureConfig,
    FixedQueryLM,
    copy_mixture_job,
    expectation,
    head_recovery,
    train_copy_mixture,
)

TINY = dict(length=8, steps=3, batch_size=4, eval_sequences=4)


def random_components(length: int, rng: np.random.Generator):
    """A sink ``u(j)``, a Toeplitz relative part ``kappa(i - j)`` and their sum."""
    u, kappa = rng.normal(size=length), rng.normal(size=2 * length - 1)
    lags = np.subtract.outer(np.arange(length), np.arange(length))
    relative = kappa[lags + length - 1]
    return u, relative, u[None, :] + relative


def test_identified_components_add_up_and_keep_attention():
    u, relative, K = random_components(12, np.random.default_rng(0))
    u_star, relative_star, K_star = identified_goat_components(u, relative, K)
    assert np.allclose(u_star[None, :] + relative_star, K_star)
    assert np.allclose(np.polyfit(np.arange(12), u_star, deg=1), 0.0)  # no line left in the sink
    for lag in range(-11, 12):
        assert np.ptp(np.diagonal(relative_star, lag)) < 1e-12  # still a function of i - j
    probs = [causal_prior_probs(torch.from_numpy(m)) for m in (K, K_star)]
    assert torch.allclose(*probs)  # only rows shifted


def test_identified_components_do_not_see_a_line_moved_between_sink_and_relative_part():
    """``u + a j + c`` with ``kappa + a (i - j) - c`` is the same prior up to row shifts ``a i``."""
    length, a, c = 10, 0.7, -2.0
    u, relative, K = random_components(length, np.random.default_rng(1))
    keys = np.arange(length)
    lags = np.subtract.outer(keys, keys)
    moved = u + a * keys + c, relative + a * lags - c, K + a * keys[:, None]
    for mine, theirs in zip(identified_goat_components(u, relative, K), identified_goat_components(*moved)):
        assert np.allclose(mine, theirs)


def test_recovery_reads_the_sink_spike_and_the_recency_peak():
    """The illustrative GOAT has a sink spike on key 0 and ALiBi-like recency: its prior peaks at the
    first token and at the query's own position, lag 1 counted from the predicted token."""
    length = 32
    recovered = head_recovery(illustrative_goat(2, length).double(), length, head=1)
    assert (recovered["sink_argmax"], recovered["relative_argmax_lag"]) == (0, 1)
    assert 0 < recovered["prior_previous"] < 1 and 0 < recovered["prior_first"] < 1


def test_recovery_finds_a_decayed_sink_peak_after_removing_its_line():
    """A sink made to rise along j (GOAT's linear ``decay`` term) still reads as peaking at its spike."""
    length = 32
    prior = illustrative_goat(1, length).double()
    with torch.no_grad():
        prior.sink.decay.fill_(-50.0)  # u(j) += 50 j / train_len: the raw sink peaks at the last key
    u, _, _ = goat_components(prior, length, 0)
    assert u.argmax() == length - 1
    assert head_recovery(prior, length, head=0)["sink_argmax"] == 0


def test_probe_is_causal():
    torch.manual_seed(0)
    model = FixedQueryLM(vocab_size=6, d_model=8, heads=2, prior=GOAT(2, 3, slope=False, train_len=10))
    tokens = torch.randint(0, 6, (2, 10))
    changed = tokens.clone()
    changed[:, 7] = (changed[:, 7] + 1) % 6
    logits, changed_logits = model(tokens)[0], model(changed)[0]
    assert logits.shape == (2, 10, 6)
    assert torch.allclose(logits[:, :7], changed_logits[:, :7])  # later tokens are never seen
    assert not torch.allclose(logits[:, 7:], changed_logits[:, 7:])


def test_probe_keeps_documents_apart_as_attention_does():
    torch.manual_seed(0)
    model = FixedQueryLM(vocab_size=6, d_model=8, heads=2, prior=GOAT(2, 3, slope=False, train_len=10))
    tokens = torch.randint(0, 6, (1, 10))
    doc_ids = torch.tensor([[0] * 4 + [1] * 6])
    positions = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4, 5]])
    packed = model(tokens, positions=positions, doc_ids=doc_ids)[0]
    alone = model(tokens[:, 4:])[0]
    assert torch.allclose(packed[:, 4:], alone, atol=1e-6)


@pytest.mark.parametrize("model", ["probe", "gpt"])
def test_training_is_a_function_of_the_seed(model):
    config = dict(model=model, d_model=64, **TINY)  # 64 wide: GOAT's 17 lanes leave most to content
    _, losses = train_copy_mixture(CopyMixtureConfig(**config), progress=False)
    _, again = train_copy_mixture(CopyMixtureConfig(**config), progress=False)
    assert losses == again and len(losses) == 3
    _, other = train_copy_mixture(CopyMixtureConfig(**config, seed=1), progress=False)
    assert other != losses


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(model="rnn"), "model must be one of ('probe', 'gpt'), got 'rnn'"),
        (dict(length=1), "length must be an int >= 2, got 1"),
        (dict(steps=0), "steps must be an int >= 1, got 0"),
        (dict(d_model=10, heads=4), "d_model=10 is not divisible by heads=4"),
        (dict(weights=(0.5, 0.5, 0.5)), "weights must sum to 1"),
    ],
)
def test_bad_config_is_named(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        CopyMixtureConfig(**kwargs)


def test_command_writes_results_and_figure(tmp_path, capsys):
    out = tmp_path / "copy"
    argv = ["analyze", "copy-mixture", "--out", str(out), "--steps", "3", "--length", "8"]
    assert (
        cli.main([*argv, "--batch-size", "4", "--heads", "2", "--d-model", "16", "--head", "1", "--quiet"])
        == 0
    )
    result = json.loads((out / "results.json").read_text())
    assert (out / FIGURE).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [(h["layer"], h["head"]) for h in result["heads"]] == [(0, 0), (0, 1)]
    assert result["head"] == 1 and result["sink_argmax"] == result["heads"][1]["sink_argmax"]
    assert 0 <= result["sink_argmax"] < 8 and 1 <= result["relative_argmax_lag"] <= 8
    assert len(result["train_losses"]) == 3
    assert result["optimal_loss"] < result["uniform_loss"] == pytest.approx(np.log(16))
    assert result["config"]["steps"] == 3
    assert result["scale"] == dict(steps=3, default_steps=600, budget=None, up_to=False, smoke=True)
    assert figure_title(out / FIGURE).startswith(
        "SMOKE RUN: 3 training steps per model, against the default 600"
    )
    assert "sink_argmax" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--weights", "0.5,0.5,0.5"], "weights must sum to 1"),
        (["--weights", "a,b"], "argument --weights: expected a number, got 'a'"),
        (["--weights", "0.5,-0.5,1"], "argument --weights: must be a number >= 0, got -0.5"),
        (["--head", "1"], "head must be in [0, 1), got 1"),
        (["--length", "1"], "argument --length: must be an integer >= 2, got 1"),
    ],
)
def test_command_errors_are_one_line(tmp_path, capsys, args, message):
    assert exit_code(["analyze", "copy-mixture", "--out", str(tmp_path / "o"), "--steps", "1", *args]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("sink, lag, verdict", [(0, 1, "agrees"), (3, 1, "differs"), (0, 2, "differs")])
def test_the_caption_says_whether_the_run_recovers_the_seeds_first_and_previous_token(sink, lag, verdict):
    measured = dict(sink_argmax=sink, relative_argmax_lag=lag)
    text = expectation(measured, CopyMixtureConfig().scale)
    assert f"This run {verdict}: the sink peaks at key {sink}, the relative part at lag {lag}." in text
    assert text.startswith("Seed 000 reports the sink peaking at key 0") and "smoke" not in text


def test_a_short_run_already_recovers_first_and_previous_token():
    """40 steps at length 16 (about a second) find both (measured on seeds 0-3)."""
    model, _ = train_copy_mixture(CopyMixtureConfig(length=16, steps=40), progress=False)
    recovered = head_recovery(model.prior, 16, head=0)
    assert (recovered["sink_argmax"], recovered["relative_argmax_lag"]) == (0, 1)


@pytest.mark.slow
def test_default_run_recovers_first_and_previous_token(tmp_path):
    """The default run (seed 0): seed 000 Fig. 1's sink at j = 0 and relative peak at the previous
    token, with the prior alone giving both tokens a large share of attention."""
    result = copy_mixture_job(CopyMixtureConfig(), tmp_path, progress=False)
    assert (result["sink_argmax"], result["relative_argmax_lag"]) == (0, 1)
    head = result["heads"][0]
    assert head["prior_first"] > 0.15 and head["prior_previous"] > 0.3
    assert result["eval_loss"] < result["optimal_loss"] + 0.1
