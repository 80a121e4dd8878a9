"""Parameter groups, the optimizers and the warmup + cosine schedule."""

from __future__ import annotations

import math

import pytest
import torch

from priorattn import PriorMultiheadAttention, SSMax
from priorattn.models import GPT, preset
from priorattn.priors import GGD, GOAT, Sum
from priorattn.train import TrainConfig
from priorattn.train.optim import build_optimizer, lr_factor, param_groups, prior_parameters


def model(**overrides) -> GPT:
    return GPT(preset("tiny", d_model=32, n_layers=2, n_heads=2, **overrides))


def test_groups_split_matrices_norms_and_priors():
    net = model(prior="ggd+goat", ssmax=True, token_shift=True)
    groups = {g["name"]: g for g in param_groups(net, TrainConfig(lr=1e-3, prior_lr=5e-2, weight_decay=0.1))}
    assert set(groups) == {"decay", "no_decay", "prior"}
    prior_ids = {id(p) for p in prior_parameters(net) if p.requires_grad}
    assert {id(p) for p in groups["prior"]["params"]} == prior_ids
    assert groups["prior"]["lr"] == 5e-2 and groups["prior"]["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in groups["decay"]["params"]) and groups["decay"]["weight_decay"] == 0.1
    assert all(p.dim() == 1 for p in groups["no_decay"]["params"]) and groups["no_decay"]["weight_decay"] == 0
    assert not prior_ids & {id(p) for p in groups["decay"]["params"] + groups["no_decay"]["params"]}
    assert any(p is net.token_shift.weight for p in groups["decay"]["params"])  # a matrix like the others
    # every trainable parameter exactly once (the tied head is the embedding)
    grouped = [id(p) for g in groups.values() for p in g["params"]]
    assert sorted(grouped) == sorted(id(p) for p in net.parameters() if p.requires_grad)


def test_groups_work_for_any_module_holding_priors():
    # One's own model: priors found as submodules at any depth, shared ones counted once.
    goat = GOAT(4, 2)
    own = torch.nn.Sequential(
        torch.nn.Linear(8, 32),
        PriorMultiheadAttention(32, 4, prior=Sum(goat, GGD(4)), ssmax=SSMax(4)),
        torch.nn.ModuleList([torch.nn.LayerNorm(32), goat]),
    )
    groups = {g["name"]: g for g in param_groups(own, TrainConfig(lr=1e-3, prior_lr=5e-2, weight_decay=0.1))}
    attn = own[1]
    expected = {id(p) for p in (*attn.prior.parameters(), *attn.ssmax.parameters()) if p.requires_grad}
    assert {id(p) for p in groups["prior"]["params"]} == expected
    assert groups["prior"]["lr"] == 5e-2 and groups["prior"]["weight_decay"] == 0.0
    grouped = [id(p) for g in groups.values() for p in g["params"]]
    assert sorted(grouped) == sorted(id(p) for p in own.parameters() if p.requires_grad)
    torch.optim.AdamW(list(groups.values())).step()  # the groups are what an optimizer takes


def test_a_module_without_priors_has_no_prior_group():
    groups = param_groups(torch.nn.Sequential(torch.nn.Linear(4, 4)), TrainConfig())
    assert [g["name"] for g in groups] == ["decay", "no_decay"]
    assert prior_parameters(torch.nn.Linear(4, 4)) == []


def test_frozen_prior_parameters_are_not_optimized():
    net = model(prior="ggd(trainable=[alpha])")
    prior = next(g for g in param_groups(net, TrainConfig()) if g["name"] == "prior")
    assert all(p.requires_grad for p in prior["params"])
    assert len(prior["params"]) == 2  # theta_alpha of each layer


def test_prior_lr_defaults_to_lr():
    groups = param_groups(model(prior="alibi+goat"), TrainConfig(lr=2e-3))
    assert all(g["lr"] == 2e-3 for g in groups)


@pytest.mark.parametrize("name, cls", [("adamw", torch.optim.AdamW), ("radam", torch.optim.RAdam)])
def test_optimizers(name, cls):
    optimizer = build_optimizer(model(), TrainConfig(optimizer=name, betas=(0.8, 0.9)))
    assert type(optimizer) is cls
    assert all(g["betas"] == (0.8, 0.9) for g in optimizer.param_groups)
    if name == "radam":
        assert all(g["decoupled_weight_decay"] for g in optimizer.param_groups)


def test_schedule_warms_up_then_decays_to_the_floor():
    config = TrainConfig(steps=110, warmup_steps=10, min_lr_ratio=0.1)
    factors = [lr_factor(s, config) for s in range(130)]
    assert factors[:10] == pytest.approx([(s + 1) / 10 for s in range(10)])
    assert factors[10] == pytest.approx(1.0)
    assert factors[60] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert all(a >= b for a, b in zip(factors[10:], factors[11:]))
    assert factors[110:] == pytest.approx([0.1] * 20)


def test_no_warmup_starts_at_the_peak():
    assert lr_factor(0, TrainConfig(steps=10, warmup_steps=0)) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(steps=0), "steps must be an int >= 1"),
        (dict(batch_size=6, grad_accum=4), "multiple of grad_accum"),
        (dict(optimizer="sgd"), "optimizer must be one of"),
        (dict(tokenizer="words"), "tokenizer must be one of"),
        (dict(lr=0.0), "lr must be > 0"),
        (dict(betas=(0.9,)), "betas must be two numbers"),
        (dict(min_lr_ratio=2.0), "min_lr_ratio must be in"),
        (dict(val_fraction=1.0), "val_fraction must be in"),
        (dict(grad_clip=0.0), "grad_clip must be > 0"),
    ],
)
def test_bad_train_config_names_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**kwargs)


def test_train_config_round_trips_through_json():
    import json

    config = TrainConfig(betas=(0.8, 0.99), prior_lr=0.01)
    assert TrainConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    with pytest.raises(ValueError, match="unknown TrainConfig fields"):
        TrainConfig.from_dict({"epochs": 3})
