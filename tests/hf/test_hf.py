"""priorattn.hf: priors inside small transformers decoders built from configs (no hub access)."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import safetensors.torch
import torch
from factories import make_prior
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    BloomConfig,
    DynamicCache,
    GemmaConfig,
    GPT2Config,
    GPTNeoXConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    PhiConfig,
    Qwen2Config,
    Qwen3Config,
    StaticCache,
)
from transformers.modeling_utils import AttentionInterface

import priorattn
import priorattn.hf as phf
from priorattn.hf.model import FrozenSlopeWarning

SIZES = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
CONFIGS = {
    "llama": lambda: LlamaConfig(**SIZES, intermediate_size=64, num_key_value_heads=2),
    "qwen3": lambda: Qwen3Config(**SIZES, intermediate_size=64, num_key_value_heads=2, head_dim=8),
    "gpt_neox": lambda: GPTNeoXConfig(**SIZES, intermediate_size=64),  # partial rotary, no GQA
    "mistral": lambda: MistralConfig(**SIZES, intermediate_size=64, num_key_value_heads=1, sliding_window=5),
}
ARCHITECTURES = list(CONFIGS)
#: Checked only for the uniform prior's equality with the model's own attention.
MORE_CONFIGS = {
    "qwen2": lambda: Qwen2Config(**SIZES, intermediate_size=64, num_key_value_heads=2),
    "phi": lambda: PhiConfig(**SIZES, intermediate_size=64),
    "gemma": lambda: GemmaConfig(**SIZES, intermediate_size=64, num_key_value_heads=1, head_dim=8),
    "gpt2": lambda: GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4),
}


def build(arch: str, seed: int = 0):
    torch.manual_seed(seed)
    config = (CONFIGS | MORE_CONFIGS)[arch]()
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return model.eval()


def left_padded(tokens: torch.Tensor, pads: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of ``tokens`` with ``pads[b]`` padding tokens in front (token 0): ids, attention mask, and
    the positions generate gives them (cumsum of the mask - 1, 0 at padding)."""
    mask = torch.ones_like(tokens)
    for b, n in enumerate(pads):
        mask[b, :n] = 0
    ids = tokens.masked_fill(mask == 0, 0)
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    return ids, mask, positions


@pytest.mark.parametrize("arch", ARCHITECTURES + list(MORE_CONFIGS))
def test_uniform_prior_with_rope_equals_the_models_sdpa(arch):
    model = build(arch)
    tokens = torch.randint(1, 64, (2, 12))
    ids, mask, positions = left_padded(tokens, [0, 3])
    with torch.no_grad():
        expected = model(ids, attention_mask=mask, position_ids=positions).logits
        phf.add_prior(model, "uniform")
        assert model.config._attn_implementation == "priorattn"
        logits = model(ids, attention_mask=mask, position_ids=positions).logits
    real = mask.bool()
    torch.testing.assert_close(logits[real], expected[real], atol=1e-5, rtol=1e-5)


@pytest.fixture
def recorded_calls(monkeypatch):
    """Every call of the "priorattn" attention: (module, q, k, v, kwargs, output)."""
    calls = []

    def record(module, q, k, v, attention_mask, **kwargs):
        out, _ = phf.prior_attention(module, q, k, v, attention_mask, **kwargs)
        calls.append((module, q, k, v, attention_mask, kwargs, out))
        return out, None

    monkeypatch.setitem(AttentionInterface._global_mapping, "priorattn", record)
    return calls


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gpt_neox"])
@pytest.mark.parametrize("prior", ["ggd", "goat", "alibi+goat"])
def test_each_layer_equals_the_reference_route_on_its_q_k_v(arch, prior, recorded_calls):
    model = build(arch)
    phf.add_prior(model, prior, prior_init="alibi", seq_len=16)
    with torch.no_grad():
        for p in phf.attention_layers(model)[1].prior.parameters():
            p.add_(0.1 * torch.randn_like(p))  # layers differ, and no parameter sits at its init
        model(torch.randint(0, 64, (2, 10)))
    assert [call[0] for call in recorded_calls] == phf.attention_layers(model)
    for module, q, k, v, _, kwargs, out in recorded_calls:
        scale = kwargs["scaling"]
        expected = priorattn.attention(q, k, v, prior=module.prior, scale=scale, backend="reference")
        torch.testing.assert_close(out, expected.transpose(1, 2), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_cached_generation_equals_uncached_with_left_padding(arch):
    model = build(arch)
    phf.add_prior(model, "goat", prior_init="alibi", seq_len=16, remove_rope=arch == "llama")
    tokens = torch.randint(1, 64, (3, 7))
    ids, mask, _ = left_padded(tokens, [0, 2, 4])
    settings = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    cached = model.generate(ids, use_cache=True, **settings)
    uncached = model.generate(ids, use_cache=False, **settings)
    assert torch.equal(cached, uncached)
    for b, n in enumerate([0, 2, 4]):  # each row as if alone: left padding changes nothing
        alone = model.generate(tokens[b : b + 1, n:], **(settings | dict(attention_mask=None)))
        assert torch.equal(alone[0], cached[b, n:])


@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_decoding_through_the_cache_gives_the_full_pass_logits(arch):
    model = build(arch)
    phf.add_prior(model, "alibi+goat", prior_init="alibi", seq_len=16)
    tokens = torch.randint(0, 64, (2, 11))
    with torch.no_grad():
        full = model(tokens, use_cache=False).logits
        cache = DynamicCache(config=model.config)
        steps = [model(tokens[:, :6], past_key_values=cache, use_cache=True).logits]
        for i in range(6, 11):
            steps.append(model(tokens[:, i : i + 1], past_key_values=cache, use_cache=True).logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_left_padding_gives_each_rows_own_logits():
    model = build("llama")
    phf.add_prior(model, "goat", prior_init="alibi", seq_len=16, remove_rope=True)  # absolute sink term
    tokens = torch.randint(1, 64, (2, 9))
    ids, mask, positions = left_padded(tokens, [0, 4])
    with torch.no_grad():
        padded = model(ids, attention_mask=mask, position_ids=positions).logits
        alone = model(tokens[1:, 4:]).logits
    torch.testing.assert_close(padded[1, 4:], alone[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_packed_sequences_attend_within_their_document(arch):
    """A row whose positions restart (no attention mask, no cache) holds separate documents."""
    model = build(arch)
    phf.add_prior(model, "goat", prior_init="alibi", seq_len=16)
    first, second = torch.randint(0, 64, (1, 5)), torch.randint(0, 64, (1, 7))
    positions = torch.cat([torch.arange(5), torch.arange(7)])[None]
    with torch.no_grad():
        packed = model(torch.cat([first, second], dim=1), position_ids=positions, use_cache=False).logits
        alone = [model(doc, use_cache=False).logits for doc in (first, second)]
    torch.testing.assert_close(packed, torch.cat(alone, dim=1), atol=1e-5, rtol=1e-5)


def test_sliding_window_of_the_model_is_kept():
    model = build("mistral")  # sliding_window=5, shorter than the sequence
    tokens = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        expected = model(tokens).logits
        phf.add_prior(model, "uniform")
        logits = model(tokens).logits
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)


def test_remove_rope_leaves_q_and_k_unrotated():
    model = build("llama")
    reference = build("llama")  # the same weights, RoPE removed another way: zero frequencies
    reference.model.rotary_emb.inv_freq.zero_()
    tokens = torch.randint(0, 64, (2, 8))
    phf.add_prior(model, "ggd", prior_init="alibi", remove_rope=True)
    phf.add_prior(reference, "ggd", prior_init="alibi")
    with torch.no_grad():
        torch.testing.assert_close(model(tokens).logits, reference(tokens).logits)
    assert isinstance(model.model.rotary_emb, phf.WithoutRotation)


@pytest.mark.parametrize(
    "options",
    [dict(prior="ggd"), dict(prior="goat", remove_rope=True, shared_prior=True), dict(prior="alibi+goat")],
)
def test_save_pretrained_and_reload_reproduce_logits_exactly(tmp_path, options):
    model = build("qwen3")
    phf.add_prior(model, prior_init="alibi", seq_len=16, **options)
    with torch.no_grad():
        for p in model.parameters():  # priors away from their init, so loading them matters
            p.add_(0.01 * torch.randn_like(p))
    tokens = torch.randint(0, 64, (2, 10))
    model.save_pretrained(tmp_path)
    loaded = phf.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert torch.equal(loaded(tokens).logits, model(tokens).logits)
    assert loaded.config.priorattn == model.config.priorattn
    shared = {id(layer.prior) for layer in phf.attention_layers(loaded)}
    assert len(shared) == (1 if options.get("shared_prior") else 2)


def test_a_plain_transformers_load_fails_naming_from_pretrained_which_carries_the_prior(tmp_path):
    model = phf.add_prior(build("llama"), "goat", prior_init="alibi", seq_len=16)
    with torch.no_grad():
        for p in model.parameters():  # priors away from their init, so losing them would show
            p.add_(0.01 * torch.randn_like(p))
    model.save_pretrained(tmp_path)
    refused = r'attn_implementation="priorattn \(load this model with priorattn\.hf\.from_pretrained\)"'
    with pytest.raises(ValueError, match=refused):
        AutoModelForCausalLM.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match=refused):
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tmp_path))
    # Naming priorattn's attention by hand loads a model without priors: its first call says so.
    plain = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="priorattn")
    tokens = torch.randint(0, 64, (1, 9))
    with pytest.raises(
        ValueError, match="has no prior: load a saved priorattn model with priorattn.hf.from_pretrained"
    ):
        plain(tokens)
    loaded = phf.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert torch.equal(loaded(tokens).logits, model.eval()(tokens).logits)
    loaded.save_pretrained(tmp_path / "again")  # a reloaded model is refused in turn
    with pytest.raises(ValueError, match=refused):
        AutoModelForCausalLM.from_pretrained(tmp_path / "again")


def test_a_plain_load_fails_without_priorattn_imported(tmp_path):
    """The refusal is in config.json: a process that never imports priorattn gets it too."""
    phf.add_prior(build("llama"), "ggd").save_pretrained(tmp_path)
    load = f"import transformers; transformers.AutoModelForCausalLM.from_pretrained({str(tmp_path)!r})"
    done = subprocess.run([sys.executable, "-c", load], capture_output=True, text=True, check=False)
    assert done.returncode != 0
    assert "load this model with priorattn.hf.from_pretrained" in done.stderr.splitlines()[-1]


@pytest.mark.parametrize(
    "make",
    [lambda: priorattn.priors.GOAT(4, 4), lambda: make_prior("ggd", 4, dtype=torch.float32)],
    ids=["goat", "ggd"],
)
def test_a_prior_module_describes_itself_and_is_rebuilt_on_loading(tmp_path, make):
    model = build("llama")
    phf.add_prior(model, make())
    with torch.no_grad():
        for p in model.parameters():  # priors away from their init, so loading them matters
            p.add_(0.01 * torch.randn_like(p))
    model.save_pretrained(tmp_path)
    loaded = phf.from_pretrained(tmp_path)
    assert loaded.config.priorattn["prior"] == make().spec()
    tokens = torch.randint(0, 64, (1, 9))
    with torch.no_grad():
        assert torch.equal(loaded.eval()(tokens).logits, model.eval()(tokens).logits)


class Unregistered(priorattn.priors.GGD):
    """A prior class no file registered: it cannot describe itself."""


def test_an_unregistered_prior_module_is_reloaded_into_the_same_module_given_again(tmp_path):
    model = build("llama")
    phf.add_prior(model, Unregistered(4, init="alibi"))
    model.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="with a Unregistered module .* pass prior= a Unregistered"):
        phf.from_pretrained(tmp_path)
    loaded = phf.from_pretrained(tmp_path, prior=Unregistered(4))
    tokens = torch.randint(0, 64, (1, 9))
    with torch.no_grad():
        assert torch.equal(loaded.eval()(tokens).logits, model.eval()(tokens).logits)


@pytest.mark.parametrize("shared", [False, True])
def test_gradients_reach_the_prior_parameters(shared):
    model = build("llama").train()
    phf.add_prior(model, "alibi+goat", prior_init="alibi", seq_len=16, shared_prior=shared)
    priors = list(dict.fromkeys(layer.prior for layer in phf.attention_layers(model)))
    assert len(priors) == (1 if shared else 2)
    with torch.no_grad():
        for p in model.parameters():  # GOAT's sink starts with a zero output layer, which stops
            p.add_(0.1 * torch.randn_like(p))  # the gradient of the layer before it
    tokens = torch.randint(0, 64, (2, 10))
    model(tokens, labels=tokens).loss.backward()
    # but the sink MLP's output bias: it adds one constant to every key's logit, which the softmax
    # cancels, so its gradient is zero but for rounding
    named = [
        (n, p) for n, p in model.named_parameters() if ".prior." in n and not n.endswith("sink.mlp.2.bias")
    ]
    assert named and all(p.grad is not None and p.grad.abs().sum() > 0 for _, p in named), [
        n for n, p in named if p.grad is None or not p.grad.abs().sum() > 0
    ]


def test_an_architecture_without_attention_interface_is_refused():
    model = AutoModelForCausalLM.from_config(BloomConfig(vocab_size=64, hidden_size=32, n_layer=1, n_head=4))
    with pytest.raises(ValueError, match="does not route its attention through .*AttentionInterface"):
        phf.add_prior(model, "ggd")


def test_a_prior_with_another_head_count_is_refused():
    with pytest.raises(ValueError, match="prior has 3 heads but the model has 4 query heads per layer"):
        phf.add_prior(build("llama"), priorattn.priors.GGD(3))


def test_bad_names_and_options_are_refused():
    with pytest.raises(ValueError, match="unknown prior 'xpos': use one of alibi, .*ggd, goat"):
        phf.add_prior(build("llama"), "xpos")
    with pytest.raises(
        ValueError, match="prior 'ggd' has no option 'window': its options are init, trainable"
    ):
        phf.add_prior(build("llama"), "ggd(window=4)")
    with pytest.raises(ValueError, match=r"prior_init must be one of \('uniform', 'alibi'\), got 'recency'"):
        phf.add_prior(build("llama"), "goat", prior_init="recency")
    with pytest.raises(TypeError, match="a Prior module carries its own"):
        phf.add_prior(build("llama"), priorattn.priors.GGD(4), prior_init="alibi")
    with pytest.raises(ValueError, match="no rotary embedding"):
        gpt2 = AutoModelForCausalLM.from_config(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=4))
        phf.add_prior(gpt2, "ggd", remove_rope=True)
    model = phf.add_prior(build("llama"), "ggd")
    with pytest.raises(ValueError, match="already has priors"):
        phf.add_prior(model, "ggd")


def test_a_missing_model_directory_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="no transformers model at .*nothing is downloaded"):
        phf.from_pretrained(tmp_path / "missing")
    build("llama").save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="not saved after priorattn.hf.add_prior"):
        phf.from_pretrained(tmp_path)


def test_unsupported_inputs_get_clear_errors():
    model = phf.add_prior(build("llama"), "ggd")
    tokens = torch.randint(0, 64, (1, 6))
    cache = StaticCache(config=model.config, max_cache_len=16)
    with pytest.raises(ValueError, match="use cache_implementation='dynamic'"):
        model(tokens, past_key_values=cache, use_cache=True)
    with pytest.raises(ValueError, match="not a 4-D mask"):
        model(tokens, attention_mask=torch.ones(1, 1, 6, 6, dtype=torch.bool))
    plain = build("llama")
    plain.set_attn_implementation("priorattn")
    with pytest.raises(ValueError, match="call priorattn.hf.add_prior"):
        plain(tokens)


def test_a_correct_reload_prints_no_load_report_of_the_prior_tensors(tmp_path, capfd):
    model = build("llama")
    phf.add_prior(model, "ggd", prior_init="alibi")
    model.save_pretrained(tmp_path)
    capfd.readouterr()
    phf.from_pretrained(tmp_path)
    shown = capfd.readouterr()
    assert "UNEXPECTED" not in shown.err + shown.out and "LOAD REPORT" not in shown.err + shown.out
    # the patterns are lent to the class only while loading: a plain load keeps its own report
    assert ".prior." not in str(LlamaForCausalLM._keys_to_ignore_on_load_unexpected)


def test_a_reload_missing_a_prior_tensor_is_still_an_error(tmp_path):
    model = build("llama")
    phf.add_prior(model, "ggd", prior_init="alibi")
    model.save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    tensors = safetensors.torch.load_file(weights)
    del tensors["model.layers.0.self_attn.prior.theta_beta"]
    safetensors.torch.save_file(tensors, weights, metadata={"format": "pt"})
    with pytest.raises(ValueError, match="theta_beta"):
        phf.from_pretrained(tmp_path)


def test_goat_started_uniform_warns_that_its_slope_cannot_train():
    with pytest.warns(FrozenSlopeWarning, match="prior_init='alibi'"):
        phf.add_prior(build("llama"), "goat")  # prior_init's default, "uniform"


@pytest.mark.parametrize(
    "spec, init", [("goat", "alibi"), ("goat(init=seeded)", None), ("goat(slope=none)", None), ("ggd", None)]
)
def test_a_goat_whose_slope_trains_or_is_absent_does_not_warn(spec, init):
    with warnings.catch_warnings():
        warnings.simplefilter("error", FrozenSlopeWarning)
        phf.add_prior(build("llama"), spec, prior_init=init)


def test_reloading_a_uniform_goat_does_not_warn_again(tmp_path):
    model = build("llama")
    with pytest.warns(FrozenSlopeWarning):
        phf.add_prior(model, "goat")
    model.save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FrozenSlopeWarning)
        phf.from_pretrained(tmp_path)
