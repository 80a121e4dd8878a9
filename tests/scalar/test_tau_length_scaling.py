"""The length rule ``tau min(1, (T / n)^2)``: its values, every route (forward, and backward as a
model trains with it), the model option at inference and in training.

Cached and sorted decoding under the rule are cases of ``test_scalar_layers.py`` and
``test_sorted_decoding.py``; bad options, of their bad-input tests.
"""

from __future__ import annotations

import pytest
import torch
from factories import exit_code

from priorattn import cli
from priorattn.files import read_json
from priorattn.models import GPT, GPTConfig
from priorattn.scalar import ScalarMultiheadAttention
from priorattn.scalar.model import set_tau_length_scaling
from priorattn.scalar.temperature import length_scaled_tau, rule_tau_init
from priorattn.train import load_run

LAYERS = {
    "scalar, per-head tau": dict(),
    "grouped, per-token tau, sink": dict(value_groups=2, tau="token", sink=True),
    "hybrid, global tau": dict(hybrid=True, encoding="rope", tau="global"),
}


def test_length_scaled_tau_shrinks_only_past_the_training_length():
    tau = torch.tensor([0.5, 2.0], dtype=torch.float64)
    scaled = length_scaled_tau(tau, torch.arange(8)[None], 4)  # n = 1 .. 8
    factor = torch.tensor(
        [1, 1, 1, 1, (4 / 5) ** 2, (4 / 6) ** 2, (4 / 7) ** 2, (4 / 8) ** 2], dtype=torch.float64
    )
    torch.testing.assert_close(scaled, tau[None, :, None] * factor, rtol=1e-15, atol=0)


def test_a_model_trained_with_the_rule_starts_at_the_usual_bandwidth_at_its_training_length():
    assert rule_tau_init(0.1, 256, 64) == 0.1 * 16
    start = torch.tensor([rule_tau_init(0.1, 256, 32)], dtype=torch.float64)
    assert length_scaled_tau(start, torch.tensor([[255]]), 32).item() == pytest.approx(0.1, rel=1e-12)
    with pytest.raises(ValueError, match="T=256 must be below the training length 256"):
        rule_tau_init(0.1, 256, 256)
    with pytest.raises(ValueError, match="must be None or the training length"):
        rule_tau_init(0.1, 256, 0)


def scaled_layer(options: dict, backend: str) -> ScalarMultiheadAttention:
    torch.manual_seed(0)
    module = ScalarMultiheadAttention(16, 4, tau_length_scaling=4, backend=backend, **options).double()
    with torch.no_grad():  # random, non-trivial parameters everywhere (the sink starts at zero)
        for p in module.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return module


@torch.no_grad()
@pytest.mark.parametrize("backend", ["auto", "sdpa", "memeff"])  # flex compiles (slow, float32)
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_every_route_equals_the_dense_definition_under_the_rule(name, backend):
    """float64, 13 tokens past T = 4: the routes fold the scaled per-token tau as a learned one."""
    x = torch.randn(2, 13, 16, dtype=torch.float64)
    reference = scaled_layer(LAYERS[name], "reference")
    expected, _ = reference(x)
    y, _ = scaled_layer(LAYERS[name], backend)(x)
    torch.testing.assert_close(y, expected, rtol=1e-9, atol=1e-9)
    reference.tau_length_scaling = None
    assert not torch.allclose(reference(x)[0], expected)  # the rule changes the output past T
    torch.testing.assert_close(reference(x[:, :4])[0], expected[:, :4], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", ["auto", "sdpa", "memeff"])
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_every_route_backpropagates_as_the_dense_definition_under_the_rule(name, backend):
    """A model trained with the rule (T below its training length): float64 gradients of the input
    and of every parameter, tau's included, through the scaled per-token tau of 13 tokens, T = 4."""
    x = torch.randn(2, 13, 16, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(2, 13, 16, dtype=torch.float64)
    grads = []
    for route in ("reference", backend):
        layer = scaled_layer(LAYERS[name], route).train()
        y, _ = layer(x)
        grads.append(torch.autograd.grad((y * weights).sum(), [x, *layer.parameters()]))
    for got, expected in zip(grads[1], grads[0]):
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)


def test_set_tau_length_scaling_turns_the_rule_on_and_off_and_records_it():
    config = GPTConfig(vocab_size=40, seq_len=8, d_model=32, n_layers=2, n_heads=4, attention="mixed")
    model = GPT(config).double().eval()
    prompt = torch.randint(40, (1, 12))
    off = model.generate(prompt, 6, greedy=True)
    logits_off, _, _ = model(prompt)
    set_tau_length_scaling(model, 8)
    assert model.config.attention_options.tau_length_scaling == 8
    assert all(block.attn.scalar.tau_length_scaling == 8 for block in model.blocks)
    logits_on, _, _ = model(prompt)
    torch.testing.assert_close(logits_on[:, :8], logits_off[:, :8], rtol=0, atol=0)
    assert not torch.allclose(logits_on[:, 8:], logits_off[:, 8:])
    saved = GPT(GPTConfig.from_dict(model.config.to_dict()))  # stored in the run's config
    assert saved.blocks[0].attn.scalar.tau_length_scaling == 8
    set_tau_length_scaling(model, None)
    assert torch.equal(model.generate(prompt, 6, greedy=True), off)
    with pytest.raises(ValueError, match="tau_length_scaling must be None or the training length"):
        set_tau_length_scaling(model, -1)
    standard = GPT(GPTConfig(vocab_size=40, seq_len=8, d_model=32, n_layers=1, n_heads=4))
    with pytest.raises(ValueError, match="this model has attention='standard'"):
        set_tau_length_scaling(standard, 8)


def test_sample_and_eval_ppl_apply_the_rule_to_a_scalar_run(make_run, tmp_path, capsys):
    run = make_run(attention="scalar")  # trained at T = 32
    results = {}
    for flag in ([], ["--tau-length-scaling"]):
        out = tmp_path / ("on" if flag else "off")
        argv = ["eval", "ppl", "--run", str(run), "--lengths", "32,96", "--windows", "2", "--out", str(out)]
        assert cli.main(argv + ["--quiet", *flag]) == 0
        results[bool(flag)] = read_json(out / "results.json")
    assert results[True]["tau_length_scaling"] and not results[False]["tau_length_scaling"]
    assert results[True]["loss"][0] == results[False]["loss"][0]  # within T the rule changes nothing
    assert results[True]["tail_loss"][1] != results[False]["tail_loss"][1]
    sample = ["sample", "--run", str(run), "--prompt", "now is the winter " * 4, "--tokens", "8", "--greedy"]
    capsys.readouterr()
    assert cli.main(sample + ["--tau-length-scaling", "--sorted-window", "128"]) == 0
    with_rule = capsys.readouterr().out
    assert cli.main(sample + ["--tau-length-scaling"]) == 0  # the window holds every key
    assert capsys.readouterr().out == with_rule
    standard = make_run()
    assert exit_code(["sample", "--run", str(standard), "--tau-length-scaling"]) == 2


def test_a_run_trained_with_the_rule_keeps_it_and_refuses_a_second_one(corpus_dir, tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["train", "--preset", "tiny", "--seq-len", "32", "--batch-size", "4", "--eval-sequences", "4"]
    argv += ["--quiet", "--steps", "2", "--data", str(corpus_dir), "--attention", "scalar"]
    assert cli.main([*argv, "--out", str(run), "--tau-length-scaling", "8"]) == 0
    assert read_json(run / "config.json")["model"]["attention_options"]["tau_length_scaling"] == 8
    assert {block.attn.tau_length_scaling for block in load_run(run).model.blocks} == {8}
    out = tmp_path / "ppl"
    ppl = ["eval", "ppl", "--run", str(run), "--lengths", "32,64", "--windows", "1", "--quiet"]
    assert cli.main([*ppl, "--out", str(out)]) == 0  # its own rule, at every length
    assert not read_json(out / "results.json")["tau_length_scaling"]
    capsys.readouterr()
    assert exit_code([*ppl, "--out", str(tmp_path / "again"), "--tau-length-scaling"]) == 2
    assert "trained with the length rule (--tau-length-scaling=8)" in capsys.readouterr().err
    assert exit_code(["sample", "--run", str(run), "--tau-length-scaling"]) == 2
    assert exit_code([*argv, "--out", str(tmp_path / "bad"), "--tau-length-scaling", "0"]) == 2
