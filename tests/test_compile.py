"""Attention reads no tensor values on the host, so models compile and accelerators never wait.

Reading a value (``bool(t)``, ``int(t)``, ``t.item()``) stalls a GPU until its queue drains and
breaks a ``torch.compile`` graph. The meta device stands in for an accelerator here: its tensors
have shapes but no values, so any read raises.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from factories import make_prior

import priorattn
from priorattn.models import GPT, GPTConfig
from priorattn.priors import GOAT, ALiBi, Sum, Uniform

#: Priors whose fold has no slope: nothing of theirs is read on the host.
SLOPELESS = ["uniform", "goat_noslope", "ggd_negative"]


@pytest.mark.parametrize("backend", ["reference", "sdpa", "memeff"])
@pytest.mark.parametrize("prior", SLOPELESS)
@pytest.mark.parametrize(
    "masks",
    [
        {},
        dict(window=5, ssmax=True),
        dict(q_pos=True, doc_ids=True, key_padding_mask=True),
    ],
    ids=["defaults", "window, ssmax", "positions, documents, padding"],
)
def test_attention_reads_no_values(backend, prior, masks):
    """Forward and backward on meta tensors: the value checks are off by default, document ids and
    positions are not inspected, and default positions are known to be a run without a read."""
    prior = make_prior(prior, 2).to("meta")
    if backend == "sdpa" and not prior.can_fold(True):
        return
    q = torch.randn(2, 2, 30, 8, device="meta", requires_grad=True)
    k = torch.randn(2, 1, 40, 8, device="meta", requires_grad=True)
    kwargs = dict(window=masks.get("window"))
    if masks.get("ssmax"):
        kwargs["ssmax"] = priorattn.SSMax(2).to("meta")
    if masks.get("q_pos"):
        kwargs.update(q_pos=torch.arange(10, 40, device="meta"), k_pos=torch.arange(40, device="meta"))
    if masks.get("doc_ids"):
        kwargs["doc_ids"] = torch.zeros(2, 40, dtype=torch.long, device="meta")
    if masks.get("key_padding_mask"):
        kwargs["key_padding_mask"] = torch.zeros(2, 40, dtype=torch.bool, device="meta")
    out = priorattn.attention(q, k, k, prior=prior, backend=backend, **kwargs)
    out.sum().backward()
    assert out.shape == (2, 2, 30, 8) and q.grad.shape == q.shape


def test_value_checks_name_non_finite_parameters_when_asked():
    prior, q = GOAT(2, 2), torch.randn(1, 2, 5, 8)
    with torch.no_grad():
        prior.alpha[1, 0] = float("nan")
    ssmax = torch.tensor([1.0, float("inf")])
    priorattn.set_value_checks(True)
    try:
        with pytest.raises(ValueError, match="GOAT.alpha has non-finite values"):
            priorattn.attention(q, q, q, prior=prior)
        with pytest.raises(ValueError, match="ssmax scales have non-finite values"):
            priorattn.attention(q, q, q, ssmax=ssmax)
    finally:
        priorattn.set_value_checks(False)


FOLDING = {
    "none": lambda: None,
    "uniform": Uniform,
    "goat_noslope": lambda: GOAT(4, 3, slope=False, train_len=16),
    "goat": lambda: GOAT(4, 3, init="recency", train_len=16),
    "alibi": lambda: ALiBi(4),
    "sum": lambda: Sum(ALiBi(4), GOAT(4, 2, slope=False, train_len=16)),
}
#: Folding priors with a slope: their largest slope sets how many queries one SDPA call may re-centre
#: (prior_inputs.slope_span), a value read on the host; each read breaks the graph.
SLOPED = {"goat", "alibi", "sum"}


def graph_breaks(module, *args, **kwargs) -> list:
    torch._dynamo.reset()
    return torch._dynamo.explain(module)(*args, **kwargs).break_reasons


def assert_compiled_equals_eager(module, run):
    """``run(module)`` returns a tensor; compare it and every parameter's gradient, compiled vs eager."""
    expected = run(module)
    expected.square().sum().backward()
    eager_grads = {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}
    module.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    out = run(torch.compile(module, backend="aot_eager"))
    out.square().sum().backward()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    assert eager_grads.keys() == {n for n, p in module.named_parameters() if p.grad is not None}
    for name, grad in eager_grads.items():
        torch.testing.assert_close(dict(module.named_parameters())[name].grad, grad, rtol=1e-5, atol=1e-6)


def assert_breaks_only_at_slope_span(breaks, prior: str):
    where = [[frame.name for frame in b.user_stack] for b in breaks]
    if prior in SLOPED:
        assert breaks and all("slope_span" in names for names in where), where
    else:
        assert not breaks, where


@pytest.mark.parametrize(
    "prior",
    # A prior with a slope compiles 8 graphs per layer: 12-19 s each on 2 CPU cores.
    [pytest.param(p, marks=pytest.mark.slow) if p in SLOPED else p for p in FOLDING],
)
def test_layer_compiles_and_matches_eager(prior):
    layer = priorattn.PriorMultiheadAttention(64, 4, prior=FOLDING[prior](), num_kv_heads=2)
    x = torch.randn(2, 24, 64)
    assert_breaks_only_at_slope_span(graph_breaks(layer, x), prior)
    assert_compiled_equals_eager(layer, lambda m: m(x)[0])


def test_rope_layer_compiles_without_breaks_and_matches_eager():
    """Compiled, RoPE forms a run's rotations in the graph: no table is read or written."""
    layer = priorattn.PriorMultiheadAttention(64, 4, encoding="rope", num_kv_heads=2)
    x = torch.randn(2, 24, 64)
    assert not graph_breaks(layer, x)
    assert not layer.rope._tables
    assert_compiled_equals_eager(layer, lambda m: m(x)[0])


@pytest.mark.slow  # a compiled two-layer model per prior: 6-40 s each on 2 CPU cores
@pytest.mark.parametrize("prior", ["uniform", "goat", "alibi", "alibi+goat"])
def test_gpt_compiles_and_matches_eager(prior):
    config = GPTConfig(
        vocab_size=64, seq_len=16, d_model=64, n_layers=2, n_heads=4, prior=prior, goat_freqs=2
    )
    model = GPT(config)
    tokens = torch.randint(0, 64, (2, 16))
    doc_ids = (torch.arange(16) >= torch.tensor([[5], [16]])).long()  # packed rows, as in training
    breaks = graph_breaks(model, tokens, doc_ids=doc_ids)
    assert_breaks_only_at_slope_span(breaks, "uniform" if prior == "uniform" else "sum")
    assert_compiled_equals_eager(model, lambda m: m(tokens, doc_ids=doc_ids)[0])
