"""GOAT against its authors' layer, ``goat-attention`` 0.1.1 (``GoatAttention``; a test extra): with
their parameters copied in, priorattn's layer gives the same outputs and gradients in float32."""

from __future__ import annotations

import pytest
import torch

from priorattn import PriorMultiheadAttention
from priorattn.priors import GOAT

goat = pytest.importorskip("goat", reason="goat-attention (a test extra) is not installed")

E, H, R, M, T = 64, 2, 3, 2, 64  # width, heads, relative and sink frequencies, training length
HD = E // H


def their_layer(sink: bool, gate: bool, seed: int) -> torch.nn.Module:
    """``GoatAttention`` for causal self-attention with random prior parameters (every term matters)."""
    torch.manual_seed(seed)
    layer = goat.GoatAttention(
        E,
        H,
        bias=False,
        batch_first=True,
        pos_rank=R,
        abs_rank=M,
        enable_key_bias=sink,
        training_seq_len=T,
        prior_init="uniform",
        prior_gate="query_norm" if gate else "none",
    )
    with torch.no_grad():
        layer.lambda_sym.normal_(0, 0.5)
        layer.lambda_asym.normal_(0, 0.5)
        layer.prior_gate_scale_raw.normal_(-1.0, 0.3)
        layer.prior_gate_bias.normal_(1.0, 0.3)
        if sink:
            for p in layer.key_bias.parameters():
                p.normal_(0, 0.5)
            layer.sink_gain.normal_(1.0, 0.5)
            layer.sink_bump.normal_(0, 1.0)
            layer.recency_slope_raw.normal_(-1.5, 0.5)
    return layer


def our_layer(
    theirs, sink: str, slope: str, gate: bool, head_dim: int | None = None
) -> PriorMultiheadAttention:
    """priorattn's layer holding ``theirs``' parameters (shapes read from it): the prior's, the first
    ``content_dim`` content lanes of q and k of each head, every value lane. priorattn keeps the slope
    in a lane of its own (re-centred near the queries), goat-attention adds it to the sink's lane: with
    both, the default head is one lane wider, a value lane of zeros, and computes their function; a
    narrower ``head_dim`` (as ``benchmarks/goat_package.py`` times) has that many fewer content lanes."""
    E, H, HD = theirs.embed_dim, theirs.num_heads, theirs.head_dim
    options = dict(sink=sink, slope=slope, gate=gate, train_len=theirs.training_seq_len, sink_freqs=theirs.M)
    if sink != "none":
        options["sink_hidden"] = theirs.key_bias.fc1.out_features
    prior = GOAT(H, theirs.R, **options)
    if head_dim is None:
        head_dim = HD + (sink != "none" and slope != "none")
    ours = PriorMultiheadAttention(E, H, prior=prior, head_dim=head_dim, backend="sdpa")
    Dc = ours.content_dim
    with torch.no_grad():
        prior.alpha.copy_(theirs.lambda_sym)
        prior.beta.copy_(theirs.lambda_asym)
        if gate:
            prior.gate_scale_raw.copy_(theirs.prior_gate_scale_raw)
            prior.gate_bias.copy_(theirs.prior_gate_bias)
        if sink != "none":
            prior.sink.mlp[0].load_state_dict(theirs.key_bias.fc1.state_dict())
            prior.sink.mlp[2].load_state_dict(theirs.key_bias.fc2.state_dict())
            prior.sink.gain.copy_(theirs.sink_gain)
            prior.sink.bump.copy_(theirs.sink_bump)
        if slope != "none":
            prior.slope_raw.copy_(theirs.recency_slope_raw)
        ours.v_proj.weight.zero_()
        ours.out_proj.weight.zero_()
        for h in range(H):
            ours.q_proj.weight[h * Dc : (h + 1) * Dc] = theirs.q_proj.weight[h * HD : h * HD + Dc]
            ours.k_proj.weight[h * Dc : (h + 1) * Dc] = theirs.k_proj.weight[h * HD : h * HD + Dc]
            rows = slice(h * head_dim, h * head_dim + HD)
            ours.v_proj.weight[rows] = theirs.v_proj.weight[h * HD : (h + 1) * HD]
            ours.out_proj.weight[:, rows] = theirs.out_proj.weight[:, h * HD : (h + 1) * HD]
    return ours


#: (their sink, our sink, our slope): their slope lives in the sink's lane, so "no sink" is a sink of
#: gain and bump 0, "no slope" a raw slope of -100 (softplus: 0 in float32).
CASES = {
    "sink_and_slope": (True, "shared", "learned"),
    "sink_only": (True, "shared", "none"),
    "slope_only": (True, "none", "learned"),
    "spectral_only": (False, "none", "none"),
}


@pytest.mark.parametrize("gate", [False, True], ids=["no_gate", "gate"])
@pytest.mark.parametrize("case", list(CASES))
def test_goat_equals_goat_attention_in_outputs_and_gradients(case, gate):
    their_sink, sink, slope = CASES[case]
    theirs = their_layer(their_sink, gate, seed=len(case))
    with torch.no_grad():
        if their_sink and sink == "none":
            theirs.sink_gain.zero_()
            theirs.sink_bump.zero_()
        if their_sink and slope == "none":
            theirs.recency_slope_raw.fill_(-100.0)
    ours = our_layer(theirs, sink, slope, gate)
    assert ours.content_dim == theirs.content_dim
    x = torch.randn(2, 48, E, generator=torch.Generator().manual_seed(1))
    x_theirs, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_theirs = theirs(x_theirs, x_theirs, x_theirs, need_weights=False, is_causal=True)[0]
    y_ours = ours(x_ours)[0]
    torch.testing.assert_close(y_ours, y_theirs, rtol=1e-5, atol=1e-5)
    grad = torch.randn_like(y_ours)
    y_theirs.backward(grad)
    y_ours.backward(grad)
    torch.testing.assert_close(x_ours.grad, x_theirs.grad, rtol=1e-5, atol=1e-5)
    prior = ours.prior
    pairs = [(prior.alpha, theirs.lambda_sym), (prior.beta, theirs.lambda_asym)]
    if gate:
        pairs += [
            (prior.gate_scale_raw, theirs.prior_gate_scale_raw),
            (prior.gate_bias, theirs.prior_gate_bias),
        ]
    if sink != "none":
        pairs += [(prior.sink.gain, theirs.sink_gain), (prior.sink.bump, theirs.sink_bump)]
        pairs += [(prior.sink.mlp[0].weight, theirs.key_bias.fc1.weight)]
    if slope != "none":
        pairs += [(prior.slope_raw, theirs.recency_slope_raw)]
    for mine, their in pairs:  # sums over every (query, key): 1e-5 of the largest
        scale = max(1.0, float(their.grad.abs().max()))
        torch.testing.assert_close(mine.grad, their.grad, rtol=1e-5, atol=1e-5 * scale)
