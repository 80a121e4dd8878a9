"""FoX's forget gate (``layers.ForgetGate``, Lin et al. ICLR 2025) in the prior layer and the GPT:
the layer against the paper's formula written out, packed documents, gradients to the gate,
cached decoding, and the ``"fox"`` mechanism."""

from __future__ import annotations

import math

import pytest
import torch
from factories import benchmark_script
from test_layers import D_MODEL, HEAD_DIM, H, decode, inputs, layer

from priorattn.layers import ForgetGate, PriorMultiheadAttention
from priorattn.models import GPT, GPTConfig


def fox_layer(**kwargs) -> PriorMultiheadAttention:
    module = layer(forget_gate=True, **kwargs)
    with torch.no_grad():  # gates spread over (0, 1): some keep, some forget
        module.forget_gate.proj.weight.mul_(4.0)
    return module


def paper_fox(module: PriorMultiheadAttention, x: torch.Tensor) -> torch.Tensor:
    """FoX written out from the paper: ``softmax(q k^T / sqrt(d) + D) v`` with
    ``D_ij = sum_{l=j+1..i} log f_l`` for ``j <= i`` (-inf above), ``f_t = sigmoid(w_f . x_t + b_f)``."""
    B, L, _ = x.shape
    q = module.q_proj(x).view(B, L, H, HEAD_DIM).transpose(1, 2)
    k = module.k_proj(x).view(B, L, H, HEAD_DIM).transpose(1, 2)
    v = module.v_proj(x).view(B, L, H, HEAD_DIM).transpose(1, 2)
    f = torch.sigmoid(x @ module.forget_gate.proj.weight.T + module.forget_gate.proj.bias)  # (B, L, H)
    D = torch.full((B, H, L, L), -math.inf, dtype=x.dtype)
    for i in range(L):
        for j in range(i + 1):
            D[:, :, i, j] = torch.log(f[:, j + 1 : i + 1]).sum(1)
    weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(HEAD_DIM) + D, dim=-1)
    y = (weights @ v).transpose(1, 2).reshape(B, L, H * HEAD_DIM)
    return module.out_proj(y)


@pytest.mark.parametrize("backend", ["reference", "sdpa", "memeff", "auto"])
def test_fox_layer_is_the_papers_formula(backend):
    module = fox_layer(backend=backend)
    x = inputs(2, 9)
    y, _ = module(x)
    torch.testing.assert_close(y, paper_fox(module, x), rtol=0, atol=1e-12)


def test_packed_row_equals_its_documents_alone():
    """``F`` restarts at each document: a packed row's outputs are its documents' own."""
    module = fox_layer(encoding="rope")
    x = inputs(1, 12)
    lengths = [5, 3, 4]
    doc_ids = torch.repeat_interleave(torch.arange(3), torch.tensor(lengths))[None]
    packed, _ = module(x, doc_ids=doc_ids, positions=torch.cat([torch.arange(n) for n in lengths]))
    alone = torch.cat([module(piece)[0] for piece in x.split(lengths, dim=1)], dim=1)
    torch.testing.assert_close(packed, alone, rtol=0, atol=1e-12)


def test_gradients_reach_the_gate_and_gradcheck():
    module = fox_layer(backend="sdpa")
    x = inputs(1, 7)
    module(x)[0].square().sum().backward()
    for p in module.forget_gate.parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().max() > 0
    weight, bias = (p.detach().clone().requires_grad_() for p in module.forget_gate.parameters())

    def attend(weight, bias):
        params = {"forget_gate.proj.weight": weight, "forget_gate.proj.bias": bias}
        return torch.func.functional_call(module, params, (x,))[0]

    assert torch.autograd.gradcheck(attend, (weight, bias))


@pytest.mark.parametrize("backend", ["auto", "sdpa", "memeff"])
@pytest.mark.parametrize("documents", [False, True])
def test_cached_decoding_equals_full_pass(backend, documents):
    """The cache keeps each key's F_j and continues from the last: a prefill, single tokens and a
    chunk equal one full pass (``auto``'s decode steps take the key bias as a tile)."""
    module = fox_layer(encoding="rope", num_kv_heads=2, backend=backend)
    x = inputs(2, 11)
    per_token = {}
    if documents:  # a document starting inside a decode chunk and one at a single step
        per_token["doc_ids"] = torch.tensor([[0] * 4 + [1] * 5 + [2] * 2, [7] * 11])
    full, full_cache = module(x, **per_token)
    with torch.no_grad():
        cached, cache = decode(module, x, [3, 1, 1, 4, 1, 1], **per_token)
    torch.testing.assert_close(cached, full.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(cache.key_state, full_cache.key_state.detach(), rtol=0, atol=1e-12)


def test_the_layer_takes_the_gate_as_a_part_whose_key_bias_it_asks_for():
    """The layer holds no FoX formula: a gate whose ``key_bias`` is zero makes it the plain layer,
    while the cache still keeps the gate's state of every key."""

    class SilentGate(ForgetGate):
        @staticmethod
        def key_bias(state):
            return torch.zeros_like(state)

    torch.manual_seed(0)
    plain = layer()
    gated = layer(forget_gate=SilentGate(D_MODEL, H))
    gated.load_state_dict(plain.state_dict(), strict=False)  # the same projections
    x = inputs(2, 7)
    y, cache = gated(x)
    torch.testing.assert_close(y, plain(x)[0], rtol=0, atol=0)
    assert cache.key_state.shape == (2, H, 7) and cache.key_state.dtype == torch.float64


def test_forget_gate_options_are_checked():
    with pytest.raises(TypeError, match="forget_gate must be None, True or a ForgetGate"):
        PriorMultiheadAttention(D_MODEL, H, forget_gate="yes")
    with pytest.raises(ValueError, match="forget_gate has 2 heads but num_heads=4"):
        PriorMultiheadAttention(D_MODEL, H, forget_gate=ForgetGate(D_MODEL, 2))
    plain = layer()
    _, cache = plain(inputs(1, 3))
    with pytest.raises(ValueError, match="disagree on a key-bias part"):
        fox_layer()(inputs(1, 2), cache=cache)


def test_gpt_with_fox_trains_and_decodes_as_a_full_pass():
    """``GPTConfig(attention="fox")``: the mechanism registry builds the layer, no new field."""
    torch.manual_seed(0)
    gpt = GPT(
        GPTConfig(vocab_size=50, seq_len=16, d_model=48, n_layers=2, n_heads=4, attention="fox")
    ).double()
    tokens = torch.randint(0, 50, (2, 12))
    logits, loss, _ = gpt(tokens, targets=tokens)
    loss.backward()
    assert all(block.attn.forget_gate.proj.weight.grad.abs().max() > 0 for block in gpt.blocks)
    with torch.no_grad():
        _, _, caches = gpt(tokens[:, :7])
        step, _, caches = gpt(tokens[:, 7:8], caches=caches)
        rest, _, _ = gpt(tokens[:, 8:], caches=caches)
    torch.testing.assert_close(torch.cat([step, rest], 1), logits[:, 7:].detach(), rtol=0, atol=1e-10)


@pytest.mark.parametrize("gate_bias", [-1.0, -4.0])
@pytest.mark.parametrize("backend", ["sdpa", "memeff"])
def test_gate_gradient_is_as_accurate_as_the_reference_route(backend, gate_bias):
    """Over 2000 tokens whose gates forget strongly (``F`` down to about -2700 and -8000 nats), the
    float32 gradient of the gate's bias errs at most twice the float32 reference route's error, both
    against the float64 reference route: the reverse cumulative sum from ``F`` back to ``log f``
    adds up every later row's rounding of the kernel's gradient rows."""
    errors = benchmark_script("fox_gradient").gate_gradient_errors(gate_bias, ("reference", backend))
    assert errors[backend][0] <= 2 * errors["reference"][0], errors
