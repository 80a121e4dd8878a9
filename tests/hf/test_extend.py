"""hf-extend: a transformers model fine-tuned with a prior at a longer length, then save_pretrained."""

from __future__ import annotations

import json

import pytest
import torch
from factories import exit_code
from transformers import AutoModelForCausalLM, LlamaConfig

import priorattn.hf as phf
from priorattn import cli
from priorattn.data import load_corpus
from priorattn.data.tokenizer import BPETokenizer
from priorattn.eval.scoring import token_losses
from priorattn.hf.extend import load_model

CONFIG = dict(
    model_type="llama",
    vocab_size=256,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
)


def test_hf_extend_from_a_config_trains_the_prior_and_saves_a_loadable_model(tmp_path, corpus_dir, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIG))
    out = tmp_path / "extended"
    argv = ["hf-extend", "--model", str(config), "--prior", "ggd", "--seq-len", "64", "--steps", "6"]
    argv += ["--data", str(corpus_dir), "--out", str(out), "--batch-size", "2", "--eval-sequences", "2"]
    argv += ["--prior-lr", "0.1", "--warmup", "1", "--quiet"]
    assert cli.main(argv) == 0
    assert "val loss at 64" in capsys.readouterr().out
    result = json.loads((out / "results.json").read_text())
    assert result["val_loss_after"] < result["val_loss_before"]
    model = phf.from_pretrained(out)
    ggd = dict(name="ggd", init="uniform", trainable=["alpha", "beta"], eps=1e-5)
    assert model.config.priorattn["prior"] == ggd and model.config.priorattn["seq_len"] == 64
    alphas = torch.stack([layer.prior.theta_alpha for layer in phf.attention_layers(model)])
    assert alphas.abs().min() > 0  # started at 0 (uniform), moved by training
    assert (out / "data.json").is_file()
    # priorattn eval scores the directory as it scores a run (a passkey prompt needs 88 bytes)
    for task, options in (("ppl", ["--windows", "1"]), ("passkey", ["--depths", "2", "--trials", "1"])):
        argv = ["eval", task, "--run", str(out), "--lengths", "128", "--quiet", *options]
        assert cli.main(argv) == 0
        evaluated = json.loads((out / "eval" / task / "results.json").read_text())
        assert evaluated["lengths"] == [128]


def test_cached_lm_scores_as_one_pass_and_keeps_its_caches(tmp_path):
    torch.manual_seed(0)
    config = LlamaConfig(**{k: v for k, v in CONFIG.items() if k != "model_type"})
    model = phf.add_prior(AutoModelForCausalLM.from_config(config).eval(), "goat", prior_init="alibi")
    lm = phf.CachedLM(model)
    tokens = torch.randint(0, 256, (2, 12))
    with torch.no_grad():
        full = model(tokens[:, :-1]).logits
        expected = torch.nn.functional.cross_entropy(full.transpose(1, 2), tokens[:, 1:], reduction="none")
        torch.testing.assert_close(token_losses(lm, tokens, chunk=4), expected, atol=1e-5, rtol=1e-5)
        _, _, caches = lm(tokens[:, :6])
        first, _, _ = lm(tokens[:, 6:8], caches=caches)
        again, _, _ = lm(tokens[:, 6:8], caches=caches)  # the same prefix, not one extended twice
    assert torch.equal(first, again)
    torch.testing.assert_close(first, full[:, 6:8], atol=1e-5, rtol=1e-5)


def test_load_model_reads_a_saved_model_and_its_tokenizer(tmp_path, corpus_dir):
    torch.manual_seed(0)
    for name, vocab in (("small", 256), ("large", 320)):
        config = LlamaConfig(
            **{k: v for k, v in CONFIG.items() if k != "model_type"} | dict(vocab_size=vocab)
        )
        AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / name)
    model, tokenizer = load_model(tmp_path / "small")
    assert tokenizer.kind == "byte"
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "small")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), saved.state_dict().values()))
    bpe = BPETokenizer.train(load_corpus(str(corpus_dir)), 300)  # more than 256 tokens
    for name in ("small", "large"):
        bpe.save(tmp_path / name)
    assert load_model(tmp_path / "large")[1].to_dict() == bpe.to_dict()
    with pytest.raises(ValueError, match="tokenizer has 2.. tokens but the model's vocab_size is 256"):
        load_model(tmp_path / "small")


def test_load_model_refuses_a_model_that_already_has_priors(tmp_path):
    config = LlamaConfig(**{k: v for k, v in CONFIG.items() if k != "model_type"})
    phf.add_prior(AutoModelForCausalLM.from_config(config), "ggd").save_pretrained(tmp_path)
    with pytest.raises(
        ValueError, match="already has priors .*hf-extend adds a prior to a model without one"
    ):
        load_model(tmp_path)


def test_hf_extend_refuses_a_missing_model_directory(tmp_path, capsys):
    argv = [
        "hf-extend",
        "--model",
        str(tmp_path / "missing"),
        "--seq-len",
        "64",
        "--out",
        str(tmp_path / "o"),
    ]
    assert exit_code(argv) == 2
    assert "no transformers model at" in capsys.readouterr().err
