"""L_align, L_spread, L_tau (seed 002 "Regularization for Efficient Inference") against dense formulas."""

from __future__ import annotations

import math

import pytest
import torch
from test_scalar_layers import layer

from priorattn.scalar import Regularization, scalar_attention, spread_loss, tau_loss


def scalar_inputs(module, x):
    """q_s, k_s ``(B, H, L)``, the vector q/k (hybrid) and tau, as the layer computes them."""
    B, L, _ = x.shape
    H, G, Dq = module.num_heads, module.value_groups, module.content_dim
    queries = module.q_proj(x).view(B, L, H, Dq + 1).transpose(1, 2)
    keys = module.k_proj(x)
    k_s = keys[..., G * Dq :].view(B, L, G, H // G).permute(0, 2, 3, 1).reshape(B, H, L)
    content = {}
    if Dq:
        k = keys[..., : G * Dq].view(B, L, G, Dq).transpose(1, 2)
        q = queries[..., :Dq]
        if module.rope is not None:
            q, k = module.rope(q, torch.arange(L)[None]), module.rope(k, torch.arange(L)[None])
        content = dict(q=q, k=k)
    return queries[..., Dq], k_s, content, module.temperature(x)


@pytest.mark.parametrize("name", ["hybrid_goat", "grouped_token_tau_sink"])
def test_align_equals_the_dense_stopgrad_sum(name):
    """The folded L_align equals mean_i sum_j stopgrad(w_ij) (q_i - k_j)^2 over an L x L matrix, in value
    and in gradient, and sends no gradient into the weights (prior, tau, vector q/k)."""
    module = layer(name).double()
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    doc_ids = torch.tensor([[0] * 4 + [1] * 5, [2] * 9])
    module.track = ("align",)
    module(x, doc_ids=doc_ids)
    ours = module.terms["align"]
    grads = torch.autograd.grad(ours, [module.q_proj.weight, module.k_proj.weight])

    q_s, k_s, content, tau = scalar_inputs(module, x)
    B, H, L = q_s.shape
    G = module.value_groups
    eye = torch.eye(L, dtype=torch.float64).expand(B, G, L, L)
    sink = None if module.sink_value is None else torch.zeros(G, L, dtype=torch.float64)
    weights = scalar_attention(
        q_s,
        k_s,
        eye,
        tau,
        prior=module.prior,
        doc_ids=doc_ids,
        sink_value=sink,
        sink_key=module.sink_key,
        backend="reference",
        **content,
    ).detach()  # (B, H, L, L)
    dense = (weights * (q_s[..., :, None] - k_s[..., None, :]) ** 2).sum(-1)
    if sink is not None:
        dense = dense + (1 - weights.sum(-1)) * (q_s - module.sink_key) ** 2
    expected = dense.mean()
    torch.testing.assert_close(ours, expected)
    for g, r in zip(grads, torch.autograd.grad(expected, [module.q_proj.weight, module.k_proj.weight])):
        torch.testing.assert_close(g, r)

    module(x, doc_ids=doc_ids)
    score_side = ("prior", "temperature", "sink", "v_proj")
    others = [p for n, p in module.named_parameters() if n.startswith(score_side)]
    assert others
    for g in torch.autograd.grad(module.terms["align"], others, allow_unused=True):
        assert g is None or not g.abs().max() > 0


def test_spread_matches_sorted_keys_to_quantile_targets():
    keys = torch.tensor([[[2.0, 0.0, 1.5]]], requires_grad=True)
    loss = spread_loss(keys, (0.0, 2.0))  # targets 0, 1, 2 for the sorted keys 0, 1.5, 2
    assert loss.item() == pytest.approx(0.25 / 3)
    (grad,) = torch.autograd.grad(loss, keys)
    torch.testing.assert_close(grad, torch.tensor([[[0.0, 0.0, 1.0 / 3]]]))  # only 1.5 is off target


def test_adaptive_spread_range_is_mean_plus_minus_three_std_and_not_differentiated():
    keys = torch.tensor([[[0.0, 1.0, 5.0]]], requires_grad=True)
    mean, std = 2.0, keys.detach().std().item()
    targets = torch.linspace(mean - 3 * std, mean + 3 * std, 3)
    expected = ((torch.tensor([0.0, 1.0, 5.0]) - targets) ** 2).mean()
    loss = spread_loss(keys, None)
    assert loss.item() == pytest.approx(expected.item())
    (grad,) = torch.autograd.grad(loss, keys)  # only through the keys: 2 (k - t) / n
    torch.testing.assert_close(grad[0, 0], 2 * (keys.detach()[0, 0] - targets) / 3)


def test_tau_loss_sums_log1p_over_heads():
    assert tau_loss(torch.tensor([0.5, 1.0])).item() == pytest.approx(math.log(1.5) + math.log(2.0))
    per_token = torch.tensor([[[0.5, 1.0], [1.0, 3.0]]])  # (B=1, H=2, L=2)
    expected = (math.log(1.5) + math.log(2) + math.log(2) + math.log(4)) / 2  # mean over tokens
    assert tau_loss(per_token).item() == pytest.approx(expected)


def test_schedule_turns_each_term_on_at_its_start():
    reg = Regularization(align=1.0, spread=0.5, tau=0.1, spread_start=100)
    assert reg.weights(99) == dict(align=1.0, spread=0.0, tau=0.1)
    assert reg.weights(100) == dict(align=1.0, spread=0.5, tau=0.1)


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(align=-1.0), "align regularizer weight must be a number >= 0"),
        (dict(spread_start=-5), "spread_start must be an int >= 0"),
        (dict(spread_range=(3.0, -3.0)), "spread_range must be"),
    ],
)
def test_bad_regularization_is_named(options, message):
    with pytest.raises(ValueError, match=message):
        Regularization(**options)
