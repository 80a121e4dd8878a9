"""scalar_attention: the folded routes equal the dense definition, forward and backward."""

from __future__ import annotations

import math

import pytest
import torch
from factories import make_prior
from hypothesis import given, settings
from hypothesis import strategies as st

from priorattn.scalar import scalar_attention
from priorattn.scalar.functional import scalar_attention_weights

TOLERANCE = {torch.float64: 1e-9, torch.float32: 2e-5}
#: bf16 inputs run in float32 (see scalar_attention); what is left is rounding the output and each
#: returned gradient to bf16: 2^-8 of the largest entry, twice for margin (``run`` feeds an output
#: gradient that bf16 holds exactly).
BF16_TOLERANCE = 2 * 2.0**-8
PRIORS = ("uniform", "alibi", "ggd", "goat", "goat_noslope", "sum")


@st.composite
def problems(draw):
    """A random call: heads and value groups, hybrid or not, tau kind, masks, prior or sink."""
    G = draw(st.integers(1, 2))
    Lk = draw(st.integers(1, 30))
    sink = draw(st.booleans())
    return dict(
        B=draw(st.integers(1, 2)),
        G=G,
        H=G * draw(st.sampled_from([1, 3])),
        Lk=Lk,
        Lq=draw(st.integers(1, Lk)),
        Dk=draw(st.sampled_from([0, 4])),  # 0: pure scalar attention
        Dv=draw(st.sampled_from([3, 8])),
        tau=draw(st.sampled_from(["global", "head", "token"])),
        causal=draw(st.booleans()),
        offset=draw(st.sampled_from([0, 0, 5])),
        window=None if sink else draw(st.sampled_from([None, None, 3])),
        docs=draw(st.booleans()),
        padding=draw(st.booleans()),
        prior="uniform" if sink else draw(st.sampled_from(PRIORS)),
        sink=sink,
        sink_key=draw(st.sampled_from([0.0, 0.7])),
        seed=draw(st.integers(0, 2**16)),
    )


def build(o, dtype):
    """Leaf tensors (float64 draws, rounded to ``dtype``), the prior and the keyword arguments."""
    gen = torch.Generator().manual_seed(o["seed"])
    B, H, G, Lq, Lk = o["B"], o["H"], o["G"], o["Lq"], o["Lk"]

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    tau_shape = {"global": (), "head": (H,), "token": (B, H, Lq)}[o["tau"]]
    tensors = dict(
        q_s=randn(B, H, Lq),
        k_s=randn(B, H, Lk),
        v=randn(B, G, Lk, o["Dv"]),
        tau=0.2 + 1.8 * torch.rand(tau_shape, generator=gen, dtype=torch.float64),
    )
    if o["Dk"]:
        tensors.update(q=randn(B, H, Lq, o["Dk"]), k=randn(B, G, Lk, o["Dk"]))
    if o["sink"]:
        tensors["sink_value"] = randn(G, o["Dv"])
    kwargs = dict(causal=o["causal"], window=o["window"])
    if o["sink"]:
        kwargs["sink_key"] = o["sink_key"]
    if o["offset"]:
        k_pos = o["offset"] + torch.arange(Lk)
        kwargs.update(k_pos=k_pos, q_pos=k_pos[Lk - Lq :])
    if o["docs"]:
        kwargs["doc_ids"] = torch.randint(0, 3, (B, Lk), generator=gen).sort(-1).values
    if o["padding"]:
        kwargs["key_padding_mask"] = torch.rand(B, Lk, generator=gen) < 0.2
    prior = make_prior(o["prior"], H, o["seed"])
    return {name: t.to(dtype) for name, t in tensors.items()}, prior, kwargs


def run(backend, tensors, prior, kwargs):
    """Output and the gradients of a fixed projection of it w.r.t. every input and prior parameter."""
    leaves = {name: t.detach().clone().requires_grad_() for name, t in tensors.items()}
    out = scalar_attention(**leaves, prior=prior, backend=backend, **kwargs)
    # Weights exact in bfloat16 (+-1, 1.25, 1.5, 1.75), so the output gradient enters a bf16 route unrounded.
    index = torch.arange(out.numel(), dtype=torch.float64)
    weights = ((-1) ** index * (1 + (index % 4) / 4)).view_as(out)
    inputs = list(leaves.values()) + [p for p in prior.parameters() if p.requires_grad]
    grads = torch.autograd.grad((out.double() * weights).sum(), inputs, allow_unused=True)
    return out, [torch.zeros_like(x) if g is None else g for x, g in zip(inputs, grads)]


def assert_close(actual, expected, tol, what):
    scale = expected.abs().max().item() + 1.0
    err = (actual.double() - expected.double()).abs().max().item()
    assert err <= tol * scale, f"{what}: max error {err:.3g} > {tol:g} x {scale:.3g}"


@pytest.mark.parametrize("backend", ["sdpa", "memeff"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@settings(max_examples=25, deadline=None)
@given(o=problems())
def test_folded_route_matches_definition(backend, dtype, o):
    tensors, prior, kwargs = build(o, dtype)
    if backend == "sdpa" and not prior.can_fold(o["causal"]):
        with pytest.raises(ValueError, match="folds into q/k lanes"):
            scalar_attention(**tensors, prior=prior, backend="sdpa", **kwargs)
        return
    reference = {name: t.double() for name, t in tensors.items()}
    ref_out, ref_grads = run("reference", reference, prior, kwargs)
    out, grads = run(backend, tensors, prior, kwargs)
    assert out.dtype == dtype and out.shape == ref_out.shape and torch.isfinite(out).all()
    tol = BF16_TOLERANCE if dtype == torch.bfloat16 else TOLERANCE[dtype]
    assert_close(out, ref_out, tol, "output")
    for i, (g, r) in enumerate(zip(grads, ref_grads, strict=True)):
        assert_close(g, r, tol if dtype == torch.bfloat16 else 20 * tol, f"gradient {i}")


@settings(max_examples=25, deadline=None)
@given(o=problems())
def test_weights_times_values_are_the_output(o):
    """scalar_attention_weights: the weights of the same call, the sink's first."""
    tensors, prior, kwargs = build(o, torch.float64)
    weights = scalar_attention_weights(**tensors, prior=prior, **kwargs)
    H, G = o["H"], o["G"]
    values = tensors["v"].repeat_interleave(H // G, dim=1)  # (B, H, Lk, Dv): each head's group
    if o["sink"]:
        sink = tensors["sink_value"].repeat_interleave(H // G, dim=0)[None, :, None]  # (1, H, 1, Dv)
        values = torch.cat([sink.expand(o["B"], H, 1, o["Dv"]), values], dim=2)
    assert weights.shape == (o["B"], H, o["Lq"], o["Lk"] + o["sink"])
    expected = scalar_attention(**tensors, prior=prior, backend="reference", **kwargs)
    torch.testing.assert_close(weights @ values, expected)
    assert ((weights.sum(-1) - 1).abs() < 1e-9).logical_or(weights.sum(-1) == 0).all()


def test_definition_is_the_gaussian_kernel_written_out():
    """seed 002 "Attention Weights": w_ts = exp(-(q_t - k_s)^2 / tau) / sum_{s' <= t}, by hand."""
    q_s = torch.tensor([[[0.0, 1.0, -0.5]]], dtype=torch.float64)
    k_s = torch.tensor([[[0.5, 1.0, 2.0]]], dtype=torch.float64)
    v = torch.tensor([[[[1.0], [10.0], [100.0]]]], dtype=torch.float64)
    tau = 0.5
    out = scalar_attention(q_s, k_s, v, tau, backend="reference")
    expected = []
    for t in range(3):
        w = [math.exp(-((q_s[0, 0, t] - k_s[0, 0, s]) ** 2) / tau) for s in range(t + 1)]
        expected.append(sum(wi * v[0, 0, s, 0] for s, wi in enumerate(w)) / sum(w))
    torch.testing.assert_close(out[0, 0, :, 0], torch.tensor(expected, dtype=torch.float64))


def test_hybrid_adds_the_scaled_dot_product():
    """seed 002 Hybrid: score = q.k / sqrt(d) - (q_s - k_s)^2 / tau, one softmax."""
    gen = torch.Generator().manual_seed(0)
    q_s, k_s = torch.randn(1, 1, 4, generator=gen), torch.randn(1, 1, 4, generator=gen)
    q, k = torch.randn(1, 1, 4, 8, generator=gen), torch.randn(1, 1, 4, 8, generator=gen)
    v = torch.eye(4)[None, None]  # the output is the weights
    out = scalar_attention(q_s, k_s, v, 0.3, q=q, k=k, causal=False, backend="reference")
    score = q[0, 0] @ k[0, 0].T / math.sqrt(8) - (q_s[0, 0, :, None] - k_s[0, 0, None, :]) ** 2 / 0.3
    torch.testing.assert_close(out[0, 0], score.softmax(-1))


def test_per_token_tau_is_the_query_bandwidth():
    """A per-token tau divides query i's row: keys are weighted by exp(-(q_i - k_j)^2 / tau_i)."""
    q_s = torch.zeros(1, 1, 2)
    k_s = torch.tensor([[[0.0, 1.0]]])
    v = torch.eye(2)[None, None]
    tau = torch.tensor([[[1.0, 0.25]]])
    out = scalar_attention(q_s, k_s, v, tau, causal=False, backend="sdpa")
    for i, t in enumerate([1.0, 0.25]):
        far = math.exp(-1 / t)
        torch.testing.assert_close(out[0, 0, i], torch.tensor([1 / (1 + far), far / (1 + far)]))


def test_heads_of_a_group_read_its_values():
    """Grouped value attention: head h reads value group h // (H / G)."""
    q_s, k_s = torch.randn(1, 4, 5), torch.randn(1, 4, 5)
    v = torch.randn(1, 2, 5, 3)
    grouped = scalar_attention(q_s, k_s, v, 0.5, backend="sdpa")
    for h in range(4):
        alone = scalar_attention(q_s[:, h : h + 1], k_s[:, h : h + 1], v[:, h // 2 : h // 2 + 1], 0.5)
        torch.testing.assert_close(grouped[:, h : h + 1], alone)


def test_sink_absorbs_mass_by_scalar_distance():
    """A query at the sink's key puts weight exp(0) on it; the output mixes in the sink value."""
    q_s = torch.tensor([[[0.0, 5.0]]])
    k_s = torch.tensor([[[5.0, 5.0]]])
    v = torch.zeros(1, 1, 2, 1)
    sink_value = torch.ones(1, 1)
    out = scalar_attention(q_s, k_s, v, 1.0, sink_value=sink_value, backend="sdpa")
    # query 0 (q=0) sees the sink (distance 0) and key 0 (distance 5): sink weight 1 / (1 + e^-25)
    assert out[0, 0, 0, 0] == pytest.approx(1 / (1 + math.exp(-25)))
    assert out[0, 0, 1, 0] == pytest.approx(math.exp(-25) / (math.exp(-25) + 2), abs=1e-12)


def test_sink_is_seen_by_a_query_without_keys():
    """Every key padding: the query still sees the sink, so its output is the sink value."""
    out = scalar_attention(
        torch.zeros(1, 1, 1),
        torch.zeros(1, 1, 2),
        torch.randn(1, 1, 2, 3),
        1.0,
        key_padding_mask=torch.ones(1, 2, dtype=torch.bool),
        sink_value=torch.arange(3.0)[None],
    )
    torch.testing.assert_close(out[0, 0, 0], torch.arange(3.0))


def test_gradcheck_through_the_fold_in_float64():
    gen = torch.Generator().manual_seed(3)
    B, H, G, L = 1, 2, 1, 6

    def leaf(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).requires_grad_()

    q_s, k_s, v, q, k = leaf(B, H, L), leaf(B, H, L), leaf(B, G, L, 3), leaf(B, H, L, 2), leaf(B, G, L, 2)
    tau = (torch.rand(B, H, L, generator=gen, dtype=torch.float64) + 0.3).requires_grad_()
    sink = leaf(G, 3)

    def f(q_s, k_s, v, q, k, tau, sink):
        return scalar_attention(q_s, k_s, v, tau, q=q, k=k, sink_value=sink, backend="sdpa")

    assert torch.autograd.gradcheck(f, (q_s, k_s, v, q, k, tau, sink))
