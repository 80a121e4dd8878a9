"""GPT: every prior x encoding, loss, shared priors, cached decoding, token shift, generation, presets,
bad configs."""

from __future__ import annotations

import json
import math

import pytest
import torch

from priorattn.data import document_positions
from priorattn.encodings import ENCODINGS, NTKAwareRoPE, YaRNRoPE
from priorattn.models import GPT, PRESETS, GPTConfig, preset
from priorattn.priors import GGD, GOAT, Sum, alibi_slopes, with_defaults
from priorattn.token_shift import LayerCaches, ShiftState
from priorattn.train.optim import prior_parameters

PRIORS = ["uniform", "alibi", "ggd", "goat", "alibi+goat"]
TINY = dict(vocab_size=50, seq_len=16, d_model=48, n_layers=2, n_heads=4)
TINY_GOAT = dict(num_freqs=2, sink_freqs=2, sink_hidden=4)  # any GOAT in a TINY model's prior


def config(**overrides) -> GPTConfig:
    if overrides.get("encoding") == "local_rope":
        overrides.setdefault("window", 4)
    fields = {**TINY, **overrides}
    fields["prior"] = with_defaults(fields.get("prior", "uniform"), goat=TINY_GOAT)
    return GPTConfig(**fields)


def model(seed=0, dtype=torch.float64, **overrides) -> GPT:
    """A GPT whose priors, SSMax scales and token shift are random, so every term of them matters."""
    torch.manual_seed(seed)
    gpt = GPT(config(**overrides)).to(dtype)
    with torch.no_grad():
        for p in prior_parameters(gpt):
            p.uniform_(-0.5, 0.5)
        for block in gpt.blocks:
            if block.attn.ssmax is not None:
                block.attn.ssmax.s.uniform_(0.5, 1.5)
        if gpt.token_shift is not None:  # W e_{t-1} about twice as large as e_t
            gpt.token_shift.weight.normal_(std=0.3)
    return gpt


def tokens(B, L, seed=1, vocab=TINY["vocab_size"]):
    return torch.randint(vocab, (B, L), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("prior", PRIORS)
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_logits_read_past_tokens_only_for_every_prior_and_encoding(prior, encoding):
    """Changing token t leaves the logits before t exactly as they were (causal), and changes the
    logits after t (the past is read)."""
    gpt = model(prior=prior, encoding=encoding)
    t, V = 4, TINY["vocab_size"]
    x = tokens(1, 7).repeat(2, 1)
    x[1, t] = (x[0, t] + 1) % V
    logits, loss, caches = gpt(x)
    assert logits.shape == (2, 7, V) and loss is None
    assert len(caches) == TINY["n_layers"] and all(len(cache) == 7 for cache in caches)
    torch.testing.assert_close(logits[1, :t], logits[0, :t], rtol=0, atol=1e-12)
    assert (logits[1, t + 1 :] - logits[0, t + 1 :]).abs().amax(-1).min() > 1e-6


def test_encodings_go_where_they_belong():
    rope, local, sinusoidal = (model(encoding=e) for e in ("rope", "local_rope", "sinusoidal"))
    assert rope.blocks[0].attn.rope is not None and rope.blocks[0].attn.window is None
    assert local.blocks[0].attn.rope is not None and local.blocks[0].attn.window == 4
    assert sinusoidal.blocks[0].attn.rope is None and sinusoidal.sinusoidal is not None


def test_loss_is_mean_cross_entropy_over_kept_targets():
    gpt = model(prior="goat", encoding="rope")
    x, targets = tokens(2, 9), tokens(2, 9, seed=2)
    targets[0, :3] = -100
    logits, loss, _ = gpt(x, targets=targets)
    kept = targets != -100
    log_probs = logits.log_softmax(-1)[kept]  # (N, V)
    expected = -log_probs.gather(-1, targets[kept][:, None]).mean()
    assert torch.isfinite(loss)
    torch.testing.assert_close(loss, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("prior", ["ggd", "goat", "alibi+goat"])
def test_shared_prior_is_one_module_counted_once(prior):
    shared, own = model(prior=prior, shared_prior=True), model(prior=prior)
    assert shared.blocks[0].attn.prior is shared.blocks[1].attn.prior
    assert own.blocks[0].attn.prior is not own.blocks[1].attn.prior
    per_layer = sum(p.numel() for p in own.blocks[0].attn.prior.parameters())
    assert own.num_parameters() - shared.num_parameters() == per_layer * (TINY["n_layers"] - 1)
    assert len(prior_parameters(own)) == TINY["n_layers"] * len(prior_parameters(shared))


def test_default_is_one_prior_per_layer_and_saved_explicitly():
    cfg = config(prior="ggd")
    assert cfg.shared_prior is False and cfg.to_dict()["shared_prior"] is False


def test_prior_parameters_are_the_priors_and_ssmax():
    gpt = model(prior="ggd", ssmax=True)
    expected = set()
    for block in gpt.blocks:
        expected |= {id(p) for p in (*block.attn.prior.parameters(), block.attn.ssmax.s)}
    assert {id(p) for p in prior_parameters(gpt)} == expected
    assert len(prior_parameters(gpt)) == len(expected)  # 2 layers x (alpha, beta, mu, s)
    assert prior_parameters(model(prior="uniform")) == []


def test_init_leaves_priors_at_their_starts():
    """nanoGPT's init touches projections only. By default a new GGD log-prior is constant per query
    (standard attention) and a new GOAT's is its seeded start, ALiBi's ``-m_h |i - j|``; with
    ``prior_init="uniform"`` GOAT's is constant up to its learned slope's start, softplus(-30) ~ 1e-13
    per token (goat-attention's uniform start)."""
    pos = torch.arange(6)
    lag = (pos[:, None] - pos[None, :]).abs()
    for prior, init in (("goat", "uniform"), ("ggd", None), ("ggd", "uniform")):
        for block in GPT(config(prior=prior, prior_init=init)).blocks:
            K = block.attn.prior.log_prior(pos, pos)  # (H, Lq, Lk)
            atol = 1e-12 if prior == "goat" else 0.0
            torch.testing.assert_close(K, K[..., :1].expand_as(K), rtol=0, atol=atol)
    for block in GPT(config(prior="goat")).blocks:
        H = block.attn.prior.num_heads
        expected = -alibi_slopes(H).float()[:, None, None] * lag
        torch.testing.assert_close(block.attn.prior.log_prior(pos, pos), expected, rtol=1e-6, atol=1e-6)


def test_init_scales_residual_projections():
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=64, seq_len=8, d_model=256, n_layers=8, n_heads=4, tie_embeddings=False))
    block = gpt.blocks[0]
    residual = 0.02 / math.sqrt(2 * 8)
    for weight, std in [
        (gpt.embed.weight, 0.02),
        (gpt.head.weight, 0.02),
        (block.attn.q_proj.weight, 0.02),
        (block.mlp.gate.weight, 0.02),
        (block.attn.out_proj.weight, residual),
        (block.mlp.down.weight, residual),
    ]:
        assert weight.std().item() == pytest.approx(std, rel=0.05)


def test_tied_head_is_the_embedding():
    tied, untied = model(), model(tie_embeddings=False)
    assert tied.head.weight is tied.embed.weight
    assert untied.head.weight is not untied.embed.weight
    V, d = TINY["vocab_size"], TINY["d_model"]
    assert untied.num_parameters() - tied.num_parameters() == V * d
    assert tied.num_parameters() - tied.num_parameters(embedding=False) == V * d


def decode(gpt: GPT, x, prefill: int, chunk: int = 1, **per_token):
    """Logits of ``x`` from a prefill of ``prefill`` tokens, then ``chunk`` tokens at a time."""
    first = {k: v[:, :prefill] for k, v in per_token.items()}
    logits, _, caches = gpt(x[:, :prefill], **first)
    outputs = [logits]
    for t in range(prefill, x.shape[1], chunk):
        step = {k: v[:, t : t + chunk] for k, v in per_token.items()}
        logits, _, caches = gpt(x[:, t : t + chunk], caches=caches, **step)
        outputs.append(logits)
    return torch.cat(outputs, dim=1), caches


@pytest.mark.parametrize("prior", ["uniform", "alibi", "ggd", "goat"])
@pytest.mark.parametrize("encoding", ["none", "rope", "sinusoidal"])
def test_cached_decoding_equals_full_forward(prior, encoding):
    gpt = model(prior=prior, encoding=encoding, ssmax=prior != "uniform")
    x = tokens(2, 11)
    full, _, _ = gpt(x)
    with torch.no_grad():
        cached, caches = decode(gpt, x, prefill=4)
    torch.testing.assert_close(cached, full.detach(), rtol=0, atol=1e-10)
    assert all(len(cache) == 11 for cache in caches)


@pytest.mark.parametrize("scaling", ["pi", "ntk", "yarn"])
@pytest.mark.parametrize("prior", ["uniform", "goat"])
def test_cached_decoding_of_an_extended_rope_equals_full_forward(scaling, prior):
    gpt = model(prior=prior, encoding="rope", rope_interpolation=4.0, rope_scaling=scaling)
    x = tokens(2, 40)  # 2.5 times seq_len
    full, _, _ = gpt(x)
    with torch.no_grad():
        cached, _ = decode(gpt, x, prefill=17, chunk=3)
    torch.testing.assert_close(cached, full.detach(), rtol=0, atol=1e-10)


@pytest.mark.parametrize("scaling", ["ntk", "yarn"])
def test_a_config_builds_the_rope_of_its_scaling_for_every_layer(scaling):
    gpt = GPT(config(encoding="rope", prior="goat", rope_interpolation=4.0, rope_scaling=scaling))
    cls = {"ntk": NTKAwareRoPE, "yarn": YaRNRoPE}[scaling]
    for block in gpt.blocks:
        rope = block.attn.rope
        assert type(rope) is cls and rope.scale == 4.0 and rope.head_dim == block.attn.content_dim
    assert scaling == "ntk" or gpt.blocks[0].attn.rope.original_len == TINY["seq_len"]
    hybrid = GPT(config(encoding="rope", attention="hybrid", rope_interpolation=4.0, rope_scaling=scaling))
    assert all(type(block.attn.rope) is cls for block in hybrid.blocks)


def test_cached_decoding_with_documents_and_positions_equals_full_forward():
    gpt = model(prior="alibi+goat", encoding="sinusoidal", ssmax=True)
    x = tokens(2, 9)
    doc_ids = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 2, 2], [4, 4, 4, 4, 4, 5, 5, 5, 5]])
    positions = torch.stack([torch.arange(9), torch.arange(9) + 100])
    full, _, _ = gpt(x, doc_ids=doc_ids, positions=positions)
    with torch.no_grad():
        cached, _ = decode(gpt, x, prefill=3, doc_ids=doc_ids, positions=positions)
    torch.testing.assert_close(cached, full.detach(), rtol=0, atol=1e-10)


#: Every prior and encoding, SSMax, and scalar heads, each with a random token shift.
SHIFTED = {
    "uniform": dict(),
    "alibi": dict(prior="alibi"),
    "ggd": dict(prior="ggd"),
    "goat": dict(prior="goat"),
    "alibi+goat": dict(prior="alibi+goat"),
    "rope": dict(encoding="rope"),
    "sinusoidal": dict(encoding="sinusoidal"),
    "local_rope": dict(encoding="local_rope", window=4),
    "ggd ssmax": dict(prior="ggd", ssmax=True),
    "rope ssmax": dict(encoding="rope", ssmax=True),
    "scalar": dict(attention="scalar"),
    "hybrid goat": dict(attention="hybrid", prior="goat"),
}
#: (2, 11): documents start at 3 (the end of a prefill of 3), 7 (the start of a chunk of 4) and 5.
SHIFT_DOC_IDS = torch.tensor([[0] * 3 + [1] * 4 + [2] * 4, [4] * 5 + [5] * 6])


@pytest.mark.parametrize("name", SHIFTED)
def test_cached_decoding_with_token_shift_equals_full_forward(name):
    """Token by token and in chunks of 4 after a prefill, with and without documents: the caches
    carry the last token's embedding and document to the next call."""
    gpt = model(token_shift=True, **SHIFTED[name])
    x = tokens(2, 11)
    with torch.no_grad():
        for per_token in ({}, dict(doc_ids=SHIFT_DOC_IDS)):
            full, _, _ = gpt(x, **per_token)
            for chunk in (1, 4):
                cached, caches = decode(gpt, x, prefill=3, chunk=chunk, **per_token)
                torch.testing.assert_close(cached, full, rtol=0, atol=1e-10)
                assert isinstance(caches, LayerCaches) and torch.equal(
                    caches.shift.embedding, gpt.embed(x[:, -1])
                )


def test_token_shift_crossing_a_boundary_would_change_the_next_documents_logits():
    """What keeps a packed document equal to itself alone: its first token, given the previous
    document's last embedding as its predecessor (attention still kept inside the document by the
    KV caches' doc_ids), gets other logits."""
    gpt = model(prior="alibi", token_shift=True)
    x, doc_ids = tokens(1, 11), SHIFT_DOC_IDS[1:]  # documents [0, 5) and [5, 11)
    with torch.no_grad():
        _, _, caches = gpt(x[:, :5], doc_ids=doc_ids[:, :5])
        crossing = LayerCaches(caches, ShiftState(caches.shift.embedding, doc_ids[:, 5]))  # same document
        packed, _, _ = gpt(x[:, 5:], doc_ids=doc_ids[:, 5:], caches=caches)
        crossed, _, _ = gpt(x[:, 5:], doc_ids=doc_ids[:, 5:], caches=crossing)
        alone, _, _ = gpt(x[:, 5:])
    torch.testing.assert_close(packed, alone, rtol=0, atol=1e-10)
    assert (crossed[:, 0] - alone[:, 0]).abs().max() > 1e-3


@pytest.mark.parametrize("overrides", [dict(prior="goat"), dict(encoding="sinusoidal", attention="hybrid")])
def test_a_new_token_shift_model_is_the_same_model_without_it(overrides):
    """W starts at zero and draws nothing from the RNG: the same seed gives every other weight and
    the same outputs. A random W changes every output but the first token's (no predecessor)."""
    torch.manual_seed(0)
    shifted = GPT(config(token_shift=True, **overrides)).double()
    torch.manual_seed(0)
    plain = GPT(config(**overrides)).double()
    weights = shifted.state_dict()
    assert torch.equal(weights.pop("token_shift.weight"), torch.zeros(TINY["d_model"], TINY["d_model"]))
    assert weights.keys() == plain.state_dict().keys()
    assert all(torch.equal(weights[name], t) for name, t in plain.state_dict().items())
    x = tokens(2, 9)
    with torch.no_grad():
        expected, _, _ = plain(x, doc_ids=SHIFT_DOC_IDS[:, :9])
        logits, _, _ = shifted(x, doc_ids=SHIFT_DOC_IDS[:, :9])
        assert torch.equal(logits, expected)
        shifted.token_shift.weight.normal_(std=0.3)
        logits, _, _ = shifted(x)
        expected, _, _ = plain(x)
    torch.testing.assert_close(logits[:, 0], expected[:, 0], rtol=0, atol=1e-12)
    assert (logits[:, 1:] - expected[:, 1:]).abs().amax(-1).min() > 1e-6


def test_token_shift_learns_from_zero():
    """The zero W gets a gradient from the first step, in every forward (DDP needs every parameter used)."""
    gpt = GPT(config(token_shift=True))
    _, loss, _ = gpt(tokens(2, 8), targets=tokens(2, 8, seed=4))
    loss.backward()
    assert gpt.token_shift.weight.grad.abs().max() > 0


PACKED_DOC_IDS = torch.tensor([[3] * 5 + [4] * 6 + [5] * 2, [6] * 13])  # (2, 13): 3 documents, then 1


@pytest.mark.parametrize("token_shift", [False, True])
@pytest.mark.parametrize(
    "prior, encoding, absolute",
    [
        ("goat", "none", True),
        ("uniform", "sinusoidal", True),
        ("alibi+goat", "rope", True),
        ("uniform", "rope", False),
        ("ggd", "none", False),
        ("alibi", "rope", False),
    ],
)
def test_packed_row_with_document_positions_equals_each_document_alone(
    prior, encoding, absolute, token_shift
):
    """With positions restarting at each document, every packed document gets the logits it gets
    when run alone from position 0; window positions do too for relative position terms only, not
    for absolute ones (GOAT's sink, sinusoids). A token shift never crosses a document."""
    gpt = model(prior=prior, encoding=encoding, token_shift=token_shift)
    assert gpt.reads_absolute_positions == absolute
    x, doc_ids = tokens(2, 13), PACKED_DOC_IDS
    packed, _, _ = gpt(x, doc_ids=doc_ids, positions=document_positions(doc_ids))
    from_window_start, _, _ = gpt(x, doc_ids=doc_ids)
    for row, start, stop in [(0, 0, 5), (0, 5, 11), (0, 11, 13), (1, 0, 13)]:
        alone, _, _ = gpt(x[row : row + 1, start:stop])
        torch.testing.assert_close(packed[row : row + 1, start:stop], alone, rtol=0, atol=1e-10)
        window = from_window_start[row : row + 1, start:stop]
        assert torch.allclose(window, alone, rtol=0, atol=1e-10) == (start == 0 or not absolute)


@pytest.mark.parametrize(
    "overrides",
    [
        dict(prior="goat"),
        dict(prior="ggd", encoding="rope"),
        dict(prior="alibi", encoding="local_rope"),
        dict(prior="alibi+goat", token_shift=True),
        dict(encoding="sinusoidal", token_shift=True),
        dict(attention="hybrid", encoding="rope", token_shift=True),
    ],
)
def test_greedy_generate_is_deterministic_and_equals_decoding_without_cache(overrides):
    gpt = model(**overrides)
    prompt = tokens(2, 5)
    out = gpt.generate(prompt, 6, greedy=True)
    assert out.shape == (2, 11) and torch.equal(out[:, :5], prompt)
    assert torch.equal(gpt.generate(prompt, 6, greedy=True), out)
    expected = prompt
    with torch.no_grad():
        for _ in range(6):  # the whole sequence again at every step, no cache
            logits, _, _ = gpt(expected)
            expected = torch.cat([expected, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("prior, encoding", [("goat", "none"), ("ggd", "none"), ("uniform", "sinusoidal")])
def test_generate_runs_past_seq_len(prior, encoding):
    gpt = model(prior=prior, encoding=encoding, dtype=torch.float32)
    prompt = tokens(1, TINY["seq_len"] + 5)
    out = gpt.generate(prompt, 4, temperature=0.8, top_k=5)
    assert out.shape == (1, TINY["seq_len"] + 9)
    assert ((out >= 0) & (out < TINY["vocab_size"])).all()


def test_sampling_follows_the_generator_and_top_k_one_is_greedy():
    gpt = model(prior="goat")
    prompt = tokens(3, 4)
    a = gpt.generate(prompt, 5, generator=torch.Generator().manual_seed(7))
    b = gpt.generate(prompt, 5, generator=torch.Generator().manual_seed(7))
    assert torch.equal(a, b)
    assert torch.equal(gpt.generate(prompt, 5, top_k=1), gpt.generate(prompt, 5, greedy=True))
    assert torch.equal(gpt.generate(prompt, 0), prompt)


def test_config_round_trips_through_json():
    cfg = preset(
        "bam-120m", prior="alibi+goat", encoding="local_rope", window=64, ssmax=True, rope_interpolation=2.5
    )
    again = GPTConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg and again.prior == "alibi+goat"
    assert again.rope_interpolation == 2.5


def test_config_saved_before_rope_interpolation_loads_without_it():
    saved = config(encoding="rope").to_dict()
    del saved["rope_interpolation"]
    assert GPTConfig.from_dict(saved).rope_interpolation == 1.0


def test_config_saved_before_rope_scaling_loads_as_position_interpolation():
    saved = config(encoding="rope", rope_interpolation=2.0).to_dict()
    del saved["rope_scaling"]
    assert GPTConfig.from_dict(saved).rope_scaling == "pi"
    yarn = config(encoding="rope", rope_interpolation=2.0, rope_scaling="yarn")
    assert GPTConfig.from_dict(json.loads(json.dumps(yarn.to_dict()))) == yarn


def test_config_saved_before_token_shift_loads_without_it_and_the_field_round_trips():
    saved = config().to_dict()
    del saved["token_shift"]
    assert GPTConfig.from_dict(saved).token_shift is False
    shifted = config(token_shift=True)
    assert GPTConfig.from_dict(json.loads(json.dumps(shifted.to_dict()))) == shifted


@pytest.mark.parametrize("interpolation, positions, plain_positions", [(2, 2, 1), (1.5, 3, 2)])
def test_rope_interpolation_reads_position_p_as_p_over_s(interpolation, positions, plain_positions):
    # RoPE's angle is theta_r * p / s: positions a * arange(L) with factor s are b * arange(L)
    # without, where a / s = b. The causal mask compares positions, so it is the same at both;
    # a prior reads unscaled positions (ALiBi's distance doubles), so the models have none.
    x = tokens(2, 12)
    interpolated = model(encoding="rope", ssmax=True, rope_interpolation=interpolation)
    plain = model(encoding="rope", ssmax=True)
    plain.load_state_dict(interpolated.state_dict())
    arange = torch.arange(12)
    logits, _, _ = interpolated(x, positions=positions * arange)
    expected, _, _ = plain(x, positions=plain_positions * arange)
    torch.testing.assert_close(logits, expected, rtol=1e-12, atol=1e-12)
    unscaled, _, _ = plain(x, positions=positions * arange)
    assert not torch.allclose(logits, unscaled)


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_small_presets_build_and_run(name):
    gpt = GPT(preset(name, prior="goat"))
    logits, loss, _ = gpt(tokens(1, 8, vocab=256), targets=tokens(1, 8, seed=3, vocab=256))
    assert logits.shape == (1, 8, 256) and torch.isfinite(loss)


# seed 003 App. C, Table 1: heads, layers, hidden, ff hidden, and parameter counts in millions
BAM_TABLE = {
    "bam-120m": dict(heads=16, layers=12, hidden=768, ff=2 * 768, embedding=25, transformer=95, bam=576),
    "bam-432m": dict(heads=24, layers=14, hidden=1536, ff=2 * 1536, embedding=50, transformer=380, bam=1008),
    "bam-1.1b": dict(heads=32, layers=15, hidden=2048, ff=4 * 2048, embedding=67, transformer=1000, bam=1440),
}


@pytest.mark.parametrize("name", BAM_TABLE)
def test_bam_presets_match_seed_003_table(name):
    row, cfg = BAM_TABLE[name], preset(name)
    assert (cfg.n_heads, cfg.n_layers, cfg.d_model, cfg.mlp_hidden) == (
        row["heads"],
        row["layers"],
        row["hidden"],
        row["ff"],
    )
    assert cfg.vocab_size == 32768 and cfg.seq_len == 512 and cfg.prior == "ggd"
    assert cfg.prior_init == "uniform"
    # Counting needs the module, not its numbers: on the meta device no weight is allocated.
    with torch.device("meta"):
        gpt = GPT(cfg)
    embedding = gpt.num_parameters() - gpt.num_parameters(embedding=False)
    assert embedding / 1e6 == pytest.approx(row["embedding"], rel=0.02)
    assert gpt.num_parameters(embedding=False) / 1e6 == pytest.approx(row["transformer"], rel=0.08)
    assert sum(p.numel() for p in prior_parameters(gpt)) == row["bam"] == 3 * cfg.n_heads * cfg.n_layers
    assert all(isinstance(block.attn.prior, GGD) for block in gpt.blocks)
    assert all(p.requires_grad == (n != "theta_mu") for n, p in gpt.blocks[0].attn.prior.named_parameters())


def test_goat_c4_preset_matches_seed_000_table():
    cfg = preset("goat-c4-125m")
    assert (cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.seq_len) == (12, 12, 768, 2048)
    assert cfg.vocab_size == 50257 and cfg.prior == "goat(num_freqs=5)"
    with torch.device("meta"):
        gpt = GPT(cfg)
    attn = gpt.blocks[0].attn
    assert isinstance(attn.prior, GOAT) and attn.prior.fold_width == 12  # d_pos = 12
    assert attn.head_dim == 64 and attn.content_dim == 64 - 12
    assert gpt.num_parameters() / 1e6 == pytest.approx(125, rel=0.05)


def test_preset_overrides_and_unknown_names():
    cfg = preset("tiny", prior="alibi+goat", seq_len=1024)
    assert cfg.prior == "alibi+goat(num_freqs=3)" and cfg.seq_len == 1024 and cfg.d_model == 128
    assert preset("tiny", prior="goat(num_freqs=8, slope=none)").prior == "goat(slope=none)"
    assert isinstance(GPT(preset("tiny", prior="alibi+goat")).blocks[0].attn.prior, Sum)
    with pytest.raises(ValueError, match=r"unknown preset 'huge'; choose from \['bam-1.1b'"):
        preset("huge")
    with pytest.raises(ValueError, match=r"unknown GPTConfig fields \['layers'\]"):
        preset("tiny", layers=3)
    assert set(PRESETS) >= {"tiny", "small", "goat-c4-125m", "bam-120m", "bam-432m", "bam-1.1b"}


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(prior="rope"), r"prior='rope': unknown prior 'rope': use one of alibi, .*ggd, goat"),
        (dict(prior="alibi+xpos"), r"prior='alibi\+xpos': unknown prior 'xpos'"),
        (
            dict(prior="goat(R=3)"),
            r"prior='goat\(R=3\)': prior 'goat' has no option 'R': its options are num_freqs",
        ),
        (dict(encoding="local_rope", window=None), "local_rope' is RoPE with a sliding window: give window="),
        (dict(encoding="alibi"), "unknown encoding 'alibi': use one of none, rope"),
        (dict(d_model=50), "d_model=50 is not divisible by n_heads=4"),
        (dict(n_kv_heads=3), "n_heads=4 is not a multiple of n_kv_heads=3"),
        (dict(n_layers=0), "n_layers must be a positive int, got 0"),
        (dict(window=0), "window must be a positive int, got 0"),
        (dict(prior_init="recency"), r"prior_init must be one of \('uniform', 'alibi'\)"),
        (dict(dropout=1.0), r"dropout must be in \[0, 1\)"),
        (dict(backend="cuda"), "backend must be one of"),
        (
            dict(encoding="rope", rope_interpolation=0.0),
            "rope_interpolation must be a finite number > 0, got 0.0",
        ),
        (
            dict(encoding="rope", rope_interpolation=float("inf")),
            "rope_interpolation must be a finite number > 0",
        ),
        (dict(encoding="rope", rope_interpolation="2"), "rope_interpolation must be a number, got '2'"),
        (dict(rope_interpolation=2.0), "it needs encoding='rope' or 'local_rope', got encoding='none'"),
        (
            dict(encoding="rope", rope_scaling="linear"),
            r"rope_scaling must be one of \('pi', 'ntk', 'yarn'\), got 'linear'",
        ),
        (
            dict(rope_scaling="yarn"),
            "rope_scaling='yarn' scales RoPE: it needs encoding='rope' or 'local_rope', got encoding='none'",
        ),
        (
            dict(encoding="rope", rope_scaling="ntk", rope_interpolation=0.5),
            "rope_scaling='ntk' extends the context: rope_interpolation must be >= 1, got 0.5",
        ),
        (dict(token_shift="yes"), "token_shift must be True or False, got 'yes'"),
        (dict(token_shift=1), "token_shift must be True or False, got 1"),
    ],
)
def test_bad_config_is_a_clear_error(overrides, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(**{**TINY, **overrides})


def test_a_prior_refusing_its_options_is_named_when_the_model_is_built():
    with pytest.raises(ValueError, match=r"prior 'ggd': trainable names unknown parameters \['gamma'\]"):
        GPT(config(prior="ggd(trainable=[gamma])"))


def test_bad_call_is_a_clear_error():
    gpt = model()
    with pytest.raises(ValueError, match=r"tokens must be an integer tensor \(B, L\)"):
        gpt(torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"targets must be an integer tensor of shape \(2, 3\)"):
        gpt(tokens(2, 3), targets=tokens(2, 4))
    with pytest.raises(ValueError, match="caches must be a list of 2 KVCache"):
        gpt(tokens(2, 3), caches=[])
    shifted = model(token_shift=True)
    _, _, caches = shifted(tokens(2, 3))
    with pytest.raises(
        ValueError, match=r"caches carry no token-shift state \(token_shift=True\): pass back"
    ):
        shifted(tokens(2, 1), caches=list(caches))
    with pytest.raises(ValueError, match="temperature must be > 0"):
        gpt.generate(tokens(1, 3), 2, temperature=0.0)
    with pytest.raises(TypeError, match="config must be a GPTConfig"):
        GPT(dict(TINY))


def test_loss_gradients_reach_the_priors():
    gpt = model(prior="alibi+goat", ssmax=True, dtype=torch.float32)
    _, loss, _ = gpt(tokens(2, 8), targets=tokens(2, 8, seed=4))
    loss.backward()
    trainable = [p for p in prior_parameters(gpt) if p.requires_grad]
    assert trainable and all(p.grad is not None and torch.isfinite(p.grad).all() for p in trainable)


def test_sinusoidal_input_is_scaled_embedding_plus_position():
    """Vaswani Sec. 3.4: token embeddings times sqrt(d_model), plus the sinusoids."""
    from priorattn.encodings import Sinusoidal

    model = GPT(
        GPTConfig(vocab_size=50, seq_len=16, d_model=32, n_layers=1, n_heads=2, encoding="sinusoidal")
    )
    seen = []
    model.blocks[0].register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    tokens = torch.randint(0, 50, (2, 7))
    model(tokens)
    expected = model.embed(tokens) * math.sqrt(32) + Sinusoidal(32)(torch.arange(7))
    torch.testing.assert_close(seen[0], expected)


def test_per_token_losses_are_each_targets_cross_entropy():
    gpt = model(prior="goat")
    x, targets = tokens(2, 9), tokens(2, 9, seed=2)
    targets[0, 3] = targets[1, 0] = -100  # no loss taken there
    logits, losses, _ = gpt(x, targets=targets, reduction="none")
    assert losses.shape == (2, 9)
    log_probs = logits.log_softmax(-1)
    for b in range(2):
        for t in range(9):
            expected = 0.0 if targets[b, t] == -100 else -log_probs[b, t, targets[b, t]].item()
            assert losses[b, t].item() == pytest.approx(expected, abs=1e-12)
    _, mean, _ = gpt(x, targets=targets)
    assert mean.item() == pytest.approx(losses.sum().item() / 16, abs=1e-12)  # 18 targets, 2 ignored


def test_losses_of_bfloat16_logits_are_computed_in_float32():
    gpt = model(prior="alibi", dtype=torch.bfloat16)
    x, targets = tokens(1, 8), tokens(1, 8, seed=2)
    logits, losses, _ = gpt(x, targets=targets, reduction="none")
    assert losses.dtype == torch.float32
    expected = torch.nn.functional.cross_entropy(logits.float()[0], targets[0], reduction="none")
    # float32 losses: in bfloat16 these losses near 4 would be off by up to 1.2e-2; this layout of the logits
    # reduces in another order, which may move the last bit
    assert (losses[0] - expected).abs().max() < 1e-5


def test_unknown_reduction_is_refused():
    with pytest.raises(ValueError, match="reduction must be 'mean' or 'none', got 'sum'"):
        model()(tokens(1, 4), targets=tokens(1, 4), reduction="sum")
